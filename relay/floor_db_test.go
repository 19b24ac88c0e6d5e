package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
)

// A target back from an outage catches up at full speed. The claims' floor
// was placed while its rows were not walked (only the other target's were),
// so everything it owes lies below it: when only the walk from the oldest
// row, once every PollInterval, reached them, the backlog went one batch a
// poll interval — 50 rows a second here, 40 s for these 2,000.
func TestTargetBackFromAnOutageCatchesUpAtFullSpeed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	n.setDown(Unavailable(errors.New("nats: disconnected")))
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 50, Workers: 4, PollInterval: time.Second})
	// Rows at a steady rate that RabbitMQ keeps up with: short claims,
	// each raising the floor.
	var ids []string
	for range 100 {
		ids = append(ids, f.insert(20, "orders.created")...)
		time.Sleep(20 * time.Millisecond)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return a.total() == len(ids) }, "amqp did not get every row while nats was down")
	n.setDown(nil)
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(ids) }, "nats did not catch up")
	if took := time.Since(start); took > 8*time.Second {
		t.Fatalf("nats took %v to catch up on 2,000 rows in batches of 50: a batch a poll interval", took)
	}
}

// slowSink takes a while per batch, like a broker's confirm round trip.
type slowSink struct {
	*fakeSink
	delay time.Duration
}

func (s *slowSink) Publish(ctx context.Context, msgs []*Message, results []error) {
	time.Sleep(s.delay)
	s.fakeSink.Publish(ctx, msgs, results)
}

// With a backlog, claims start past the newest row this relay claimed (so
// that they do not step over the rows its other batches hold), yet a row
// behind that point that becomes claimable — one another relay held and
// released, or one whose lower id committed late — is taken within a
// PollInterval or so, not after the backlog.
func TestRowBehindTheClaimFloorIsTakenDuringABacklog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// behind makes one row that precedes the backlog but cannot be
		// claimed yet, and returns its message id and what makes it
		// claimable.
		behind func(f *fixture) (string, func() error)
	}{
		{"released by another relay", func(f *fixture) (string, func() error) {
			id := f.insert(1, "orders.first")[0]
			tx, err := f.pool.Begin(context.Background())
			if err != nil {
				f.t.Fatal(err)
			}
			f.t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // released in the test
			if _, err := tx.Exec(context.Background(), `SELECT 1 FROM `+f.table.Ident()+` WHERE message_id = @message_id FOR UPDATE`, pgx.NamedArgs{"message_id": id}); err != nil {
				f.t.Fatal(err)
			}
			return id, func() error { return tx.Rollback(context.Background()) }
		}},
		{"committed late", func(f *fixture) (string, func() error) {
			tx, err := f.pool.Begin(context.Background())
			if err != nil {
				f.t.Fatal(err)
			}
			f.t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // committed in the test
			var id string
			if err := tx.QueryRow(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, payload)
				VALUES ('orders.first', '\x00') RETURNING message_id::text`).Scan(&id); err != nil {
				f.t.Fatal(err)
			}
			return id, func() error { return tx.Commit(context.Background()) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			first, release := tc.behind(f)
			const backlog = 20000
			f.insert(backlog, "orders.created")

			n := &slowSink{fakeSink: newFake(TargetNATS), delay: 50 * time.Millisecond}
			// 4 workers × 50 rows per 50 ms: the backlog lasts 5 s or more.
			f.start(Config{Sinks: []Sink{n}, BatchSize: 50, Workers: 4, PollInterval: 100 * time.Millisecond})
			testenv.Eventually(t, 20*time.Second, func() bool { return n.total() >= 1000 }, "relay not started")
			if got, _ := n.count(first); got != 0 {
				t.Fatal("the row behind was published before it could be claimed")
			}
			if err := release(); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 20*time.Second, func() bool { got, _ := n.count(first); return got == 1 }, "row behind never published")
			if left := backlog + 1 - n.total(); left < 5000 {
				t.Fatalf("the row behind was published with %d rows left: want it taken during the backlog, not after", left)
			}
			testenv.Eventually(t, 60*time.Second, func() bool { return f.countDone() == backlog+1 }, "rows not all done")
			if got, _ := n.count(first); got != 1 {
				t.Fatalf("row behind published %d times", got)
			}
		})
	}
}

// A relay's claims run one at a time, each starting where the one before it
// ended: claims running together start at the same floor, and each walks
// over and tries to lock the rows the others are taking. Nothing is lost or
// sent twice for it.
func TestClaimsOfOneRelayDoNotOverlap(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	ids := f.insert(2000, "orders.created")
	var inClaim, most, claims atomic.Int64
	f.startWith(Config{Sinks: []Sink{a, n}, BatchSize: 50, Workers: 4}, func(r *Relay) {
		r.hooks = &testHooks{
			claiming: func() {
				now := inClaim.Add(1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				time.Sleep(2 * time.Millisecond) // the other workers are ready to claim by now
			},
			claimed: func(int, floors) {
				claims.Add(1)
				inClaim.Add(-1)
			},
		}
	})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(ids) }, "rows not all done")
	if m := most.Load(); m != 1 {
		t.Errorf("%d claims of one relay ran at once", m)
	}
	if c := claims.Load(); c < int64(len(ids)/50) {
		t.Errorf("%d claims for %d rows in batches of 50", c, len(ids))
	}
	for _, id := range ids {
		if ga, _ := a.count(id); ga != 1 {
			t.Fatalf("amqp got %s %d times", id, ga)
		}
		if gn, _ := n.count(id); gn != 1 {
			t.Fatalf("nats got %s %d times", id, gn)
		}
	}
}

// At a steady rate (every claim short), the outbox's floors pass a row
// whose transaction took its id and stays open — the rows after it are not
// walked again and again while it runs — and the claim that first sees that
// transaction ended walks back to it once: the row is taken at once after
// its commit, not by a recheck (every PollInterval, an hour here). The same
// for a keyed row among keyed rows.
func TestTheFloorPassesAnOpenTransactionAndWalksBackAtItsEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		key   func(i int) *string
		floor func(floors) int64
	}{
		{"unkeyed", func(int) *string { return nil }, func(fl floors) int64 { return fl.fresh.from }},
		{"keyed", func(i int) *string { k := fmt.Sprint("k", i); return &k }, func(fl floors) int64 { return fl.keyed }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setupOwnDatabase(t)
			a, n := newFake(TargetAMQP), newFake(TargetNATS)
			var mu sync.Mutex
			var seen []int64
			f.startWith(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: time.Hour}, func(r *Relay) {
				r.hooks = &testHooks{claimed: func(_ int, fl floors) {
					mu.Lock()
					seen = append(seen, tc.floor(fl))
					mu.Unlock()
				}}
			})
			lastFloor := func() int64 {
				mu.Lock()
				defer mu.Unlock()
				return seen[len(seen)-1]
			}
			testenv.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) >= 3 }, "relay did not start")
			insert := func(q pgx.Tx, i int) (id int64, msg string) {
				t.Helper()
				const sql = `(topic, payload, key) VALUES ('orders.created', '\x00', @key) RETURNING id, message_id::text`
				var err error
				if q != nil {
					err = q.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+sql, pgx.NamedArgs{"key": tc.key(i)}).Scan(&id, &msg)
				} else {
					err = f.pool.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+sql, pgx.NamedArgs{"key": tc.key(i)}).Scan(&id, &msg)
				}
				if err != nil {
					t.Fatal(err)
				}
				return id, msg
			}

			// A producer's transaction takes an id and stays open...
			late, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer late.Rollback(ctx) //nolint:errcheck // committed below
			lateID, lateMsg := insert(late, 0)
			// ...while later rows commit and are delivered one claim at a
			// time: the claims walk from past it.
			done := 0
			testenv.Eventually(t, time.Minute, func() bool {
				done++
				insert(nil, done)
				testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done }, "row not delivered")
				return lastFloor() > lateID
			}, "claims still start at or below row %d while its transaction is open: the floor waits for it", lateID)
			if got, _ := n.count(lateMsg); got != 0 {
				t.Fatal("the open transaction's row was published")
			}
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			committed := time.Now()
			// Other rows keep coming, as at a steady rate: each claim is a chance.
			for {
				if got, _ := n.count(lateMsg); got == 1 {
					break
				}
				if time.Since(committed) > 5*time.Second {
					t.Fatalf("row %d not taken %v after its commit", lateID, time.Since(committed).Round(time.Millisecond))
				}
				done++
				insert(nil, done)
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("row %d, behind the floor, taken %v after its commit", lateID, time.Since(committed).Round(time.Millisecond))
			testenv.Eventually(t, 10*time.Second, func() bool { got, _ := a.count(lateMsg); return got == 1 }, "amqp never got the late row")
		})
	}
}

// A transaction that stays open while more than foldSpan rows pass leaves,
// when it ends, a gap far below the floor: a sweep walks it, beside the
// ordinary claims. While that sweep is held back, the rows committed
// meanwhile are delivered; when it goes on, the transaction's row is too.
func TestASweepRunsBesideTheClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setupOwnDatabase(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	sweeping, release := make(chan struct{}, 1), make(chan struct{})
	var released sync.Once
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: time.Hour}, func(r *Relay) {
		r.hooks = &testHooks{sweeping: func() {
			select {
			case sweeping <- struct{}{}:
			default:
			}
			<-release
		}}
	})
	t.Cleanup(func() { released.Do(func() { close(release) }) }) // before the relay stops
	done := len(f.insert(1, "orders.created"))
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done }, "relay did not start")

	held, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx) //nolint:errcheck // committed below
	var heldMsg string
	if err := held.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.held', '\x00')
		RETURNING message_id::text`).Scan(&heldMsg); err != nil {
		t.Fatal(err)
	}
	done += len(f.insert(2*foldSpan, "orders.created"))
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == done }, "rows past the open transaction not delivered")
	// A batch's worth of claims ended full; a short one raises the floor
	// past the open transaction's row.
	done += len(f.insert(1, "orders.created"))
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done }, "row not delivered")
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	done += len(f.insert(1, "orders.created")) // a claim that sees it ended
	select {
	case <-sweeping:
	case <-time.After(10 * time.Second):
		t.Fatal("no sweep after the transaction ended far below the floor")
	}
	// The sweep waits; the claims go on.
	later := f.insert(20, "orders.created")
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done+len(later) }, "rows committed during the sweep not delivered: the claims wait for it")
	if got, _ := n.count(heldMsg); got != 0 {
		t.Fatal("the ended transaction's row was taken by a claim, not the sweep")
	}
	released.Do(func() { close(release) })
	testenv.Eventually(t, 10*time.Second, func() bool {
		ga, _ := a.count(heldMsg)
		gn, _ := n.count(heldMsg)
		return ga == 1 && gn == 1
	}, "the ended transaction's row not delivered after the sweep")
	for _, id := range later {
		if ga, _ := a.count(id); ga != 1 {
			t.Fatalf("amqp got %s %d times", id, ga)
		}
	}
}

// After an outage, while a transaction holds VACUUM's horizon, every row
// that went through the owed table stays in its indexes. The claims that
// follow walk from past them: what a claim reads does not grow with them.
func TestOwedWalksPassWhatAnOutageLeftDead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold func(ctx context.Context, f *fixture, tx pgx.Tx) error
	}{
		{"a producer's transaction", func(ctx context.Context, f *fixture, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.held', '\x00')`)
			return err
		}},
		{"a REPEATABLE READ snapshot", func(ctx context.Context, f *fixture, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT count(*) FROM `+f.table.Ident())
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setupOwnDatabase(t)
			a, n := newFake(TargetAMQP), newFake(TargetNATS)
			n.setDown(Unavailable(errors.New("nats: disconnected")))
			const batch = 100
			r, cancel, stopped := f.start(Config{Sinks: []Sink{a, n}, BatchSize: batch, Workers: 2, PollInterval: time.Second})

			held, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Rollback(ctx) //nolint:errcheck // a hold only
			if err := tc.hold(ctx, f, held); err != nil {
				t.Fatal(err)
			}
			// The outage: rows, keyed and not, reach RabbitMQ and move to the
			// owed table; then every one of them reaches JetStream.
			const rows = 10000
			for i := range rows / 200 {
				if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload, key)
					SELECT 'orders.created', '\x00', CASE WHEN g % 2 = 0 THEN 'k' || (g % 40) END
					FROM generate_series(@from, @from + 199) g`, pgx.NamedArgs{"from": i * 200}); err != nil {
					t.Fatal(err)
				}
			}
			testenv.Eventually(t, time.Minute, func() bool { return a.total() == rows }, "amqp did not get every row while nats was down")
			n.setDown(nil)
			testenv.Eventually(t, time.Minute, func() bool { return f.countDone() == rows }, "nats did not catch up on the owed rows")
			// Rows after it lift the floors past it.
			var last string
			past := func() bool {
				r.floor.mu.Lock()
				defer r.floor.mu.Unlock()
				if s := fmt.Sprintf("owed floors: unkeyed %d, keyed %d; the outbox's rechecked to %d, %d held",
					r.floor.safe, r.floor.keyed.owed, r.floor.fresh.rechecked, len(r.floor.fresh.held)); s != last {
					t.Log(s)
					last = s
				}
				return r.floor.safe >= rows && r.floor.keyed.owed >= rows
			}
			after := 0
			testenv.Eventually(t, 3*time.Minute, func() bool {
				after += 10
				f.insert(10, "orders.after")
				testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == rows+after }, "rows after the outage not delivered")
				return past()
			}, "the owed table's floors never passed the outage's rows")
			// Nor does the walk from the oldest row step over them every
			// PollInterval: nothing asked for it, and its backstop is minutes
			// apart.
			r.floor.mu.Lock()
			lastWalk := r.floor.lastOldestWalk
			r.floor.mu.Unlock()
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
				after += 10
				f.insert(10, "orders.after")
				testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == rows+after }, "rows after the outage not delivered")
			}
			r.floor.mu.Lock()
			walked := r.floor.lastOldestWalk != lastWalk
			r.floor.mu.Unlock()
			if walked {
				t.Error("the owed table was walked from its oldest row again within 3 poll intervals")
			}
			// JetStream goes again while a row of each key reaches RabbitMQ:
			// those rows are their keys' heads in the owed table, and a claim
			// asks of each whether an earlier row of its key is still in the
			// outbox, which must not step over the key's rows the outage
			// left dead there.
			n.setDown(Unavailable(errors.New("nats: disconnected")))
			owedKeys := func() (k int) {
				t.Helper()
				if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.table.Owed()+` WHERE key IS NOT NULL AND nats_delivered_at IS NULL`).Scan(&k); err != nil {
					t.Fatal(err)
				}
				return k
			}
			if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload, key)
				SELECT 'orders.second', '\x00', 'k' || g FROM generate_series(0, 38, 2) g`); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, func() bool { return owedKeys() == 20 }, "the second outage's rows did not move to the owed table")
			cancel()
			<-stopped
			// A transaction the relay remembers (a batch of its own) may
			// have ended after its last claim: the next claim walks back to
			// where its rows may start, once (and a sweep of the gap it
			// leaves), and the one after rises again. Claims taking nothing
			// (JetStream still down) do that; the plan below is of the
			// claims after.
			amqpOnly := phase{perTarget[bool]{AMQP: true}}
			var fl floors // the plan's: an ordinary claim's after two others
			for ordinary, tries := 0, 0; ; tries++ {
				if tries == 12 {
					t.Fatal("12 claims and the floors have not settled")
				}
				fl = r.floor.begin(r.floor.lastOldestWalk, dualWrite)
				if !fl.beside() {
					if ordinary == 2 {
						r.floor.end(fl, true)
						break
					}
					ordinary++
				}
				if rows := claimWith(t, f.pool, r.store, r.floor, fl, dualWrite, amqpOnly, batch); len(rows) > 0 {
					t.Fatalf("a claim with JetStream down took %d rows, want none", len(rows))
				}
			}

			var pages int64
			if err := f.pool.QueryRow(ctx, `SELECT pg_relation_size(@owed::regclass) / current_setting('block_size')::int`,
				pgx.NamedArgs{"owed": f.table.Owed()}).Scan(&pages); err != nil {
				t.Fatal(err)
			}
			claimBlocks := func(fl floors) float64 {
				t.Helper()
				tx, err := f.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck // a plan only
				return planBlocks(t, tx, r.store.sql.Claim, pgx.StrictStructArgs(outboxsql.ClaimParams{
					AMQPActive: true, NATSActive: true, AMQPEnabled: true, NATSEnabled: true, BatchSize: batch, KeyedWindow: keyWindow * batch, KeyedRows: batch / 2,
					OwedFloor: fl.owed, OwedSafe: fl.owedSafe, OwedKeyedFloor: fl.owedKeyed,
					FreshFrom: fl.fresh.from, FreshTo: math.MaxInt64, KeyedFloor: fl.keyed,
					FreshKeyedFloor: fl.freshKeyed, KeyedPendingXIDs: fl.pendingXIDs, KeyedPendingFrom: fl.pendingFrom,
				}))
			}
			ours := claimBlocks(fl)
			oldest := claimBlocks(floors{fresh: fl.fresh, keyed: fl.keyed})
			t.Logf("owed table: %d pages, all but a row per key dead; a claim of a row per key reads %.0f blocks from the floors (owed %d, safe %d, keyed %d; the outbox's keyed %d, %d transactions remembered), %.0f from the oldest owed row",
				pages, ours, fl.owed, fl.owedSafe, fl.owedKeyed, fl.keyed, len(fl.pendingXIDs), oldest)
			if ours*4 > oldest {
				t.Errorf("a claim reads %.0f blocks from the owed floors, %.0f from the oldest row: it steps over the %d rows the outage left", ours, oldest, rows)
			}
			if err := held.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if got := n.total(); got < rows {
				t.Fatalf("nats got %d rows, want %d", got, rows)
			}
		})
	}
}

// A keyed row parked for RabbitMQ holds its key (SkipParkedKeys off): the
// later row of its key waits in the owed table. Put back, the parked row is
// its key's head again and goes first, though the claims' floors rose past
// it meanwhile. PollInterval is an hour: no walk from the oldest row runs.
func TestAKeyedRowPutBackFromParkedGoesFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var first atomic.Int64
	a.setFail(func(m *Message) error {
		if m.ID == first.Load() {
			return &PermanentError{Reason: "refused"}
		}
		return nil
	})
	var ids [2]int64
	var msgs [2]string
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if err := tx.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload, key) VALUES ('orders.created', '\x00', 'k')
			RETURNING id, message_id::text`).Scan(&ids[i], &msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	first.Store(ids[0])
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f.start(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: time.Hour})
	testenv.Eventually(t, 10*time.Second, func() bool { return f.state(msgs[0]).amqpParked && f.state(msgs[1]).natsDelivered },
		"the first row not parked for amqp, or the second not sent to nats")
	// Rows after them lift the floors past both.
	done := f.countDone()
	for range 5 {
		done += len(f.insert(10, "orders.after"))
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done }, "rows after them not delivered")
	}
	if got, _ := a.count(msgs[1]); got != 0 {
		t.Fatal("the second row of the key reached amqp while the first was parked")
	}
	first.Store(0)
	if _, err := RetryParked(ctx, f.pool, f.table, []Target{TargetAMQP}, ParkedIDs(ids[0])); err != nil {
		t.Fatal(err)
	}
	f.insert(1, "orders.after") // a claim
	testenv.Eventually(t, 10*time.Second, func() bool { got, _ := a.count(msgs[1]); return got == 1 }, "the key's rows never reached amqp")
	if got, _ := a.count(msgs[0]); got != 1 {
		t.Fatalf("the key's second row reached amqp before its first, put back from parked (first sent %d times)", got)
	}
	checkKeyOrder(t, "amqp", a.confirmedOrder(), map[int64]string{ids[0]: "k", ids[1]: "k"})
}

// An unkeyed row parked for RabbitMQ is not owed, so the owed floors pass
// it. Put back, it is taken at once, with no row after it: RetryParked's
// notification sends every relay's owed floors back to it. The backstop
// walk from the oldest row is minutes away.
func TestAnUnkeyedRowPutBackFromParkedIsTakenAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	refuse := atomic.Bool{}
	refuse.Store(true)
	a.setFail(func(m *Message) error {
		if refuse.Load() && m.Topic == "orders.refused" {
			return &PermanentError{Reason: "refused"}
		}
		return nil
	})
	msg := f.insert(1, "orders.refused")[0]
	r, _, _ := f.start(Config{Sinks: []Sink{a, n}, Workers: 2})
	testenv.Eventually(t, 10*time.Second, func() bool { s := f.state(msg); return s.amqpParked && s.natsDelivered },
		"the row not parked for amqp and sent to nats")
	var id int64
	if err := f.pool.QueryRow(ctx, `SELECT id FROM `+f.table.Owed()+` WHERE message_id = @m`, pgx.NamedArgs{"m": msg}).Scan(&id); err != nil {
		t.Fatal(err)
	}
	// Rows after it lift the owed floor past it. A transaction anywhere in
	// the cluster that ends just before a claim leaves a gap below it until
	// the next claim, so the floor is asked until it has passed.
	done := f.countDone()
	var next time.Time
	testenv.Eventually(t, 30*time.Second, func() bool {
		done += len(f.insert(10, "orders.after"))
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done }, "rows after it not delivered")
		r.floor.mu.Lock()
		defer r.floor.mu.Unlock()
		next = r.floor.lastOldestWalk.Add(fullWalkEvery)
		return r.floor.safe >= id
	}, "the owed floor did not pass the parked row: the test shows nothing")
	refuse.Store(false)
	if _, err := RetryParked(ctx, f.pool, f.table, []Target{TargetAMQP}, ParkedIDs(id)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { got, _ := a.count(msg); return got == 1 },
		"the row put back never reached amqp")
	if time.Now().After(next) {
		t.Fatal("the backstop walk from the oldest row was due: the test shows nothing")
	}
}

// The claim's probes of the owed table count only the targets the phase
// enables: in the legacy phase an unkeyed row parked for RabbitMQ, which
// JetStream never had, does not hold the owed floor below it. A keyed one
// does, for RabbitMQ: put back, it is its key's head.
func TestOwedProbesCountEnabledTargetsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	for _, key := range []string{"NULL", "'k'"} {
		var msg string
		if err := f.pool.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload, key) VALUES ('orders.created', '\x00', `+key+`)
			RETURNING message_id::text`).Scan(&msg); err != nil {
			t.Fatal(err)
		}
		f.setRow(msg, `amqp_parked_at = now(), amqp_attempts = 5, amqp_last_error = 'refused'`)
	}
	legacy := phase{perTarget[bool]{AMQP: true}}
	for _, tc := range []struct {
		name           string
		enabled        phase
		unkeyed, keyed bool
	}{
		{"legacy: amqp only", legacy, false, true},
		{"dual write", dualWrite, true, true},
	} {
		conn, err := f.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, snap, err := newStore(f.table).claim(ctx, conn, tc.enabled, tc.enabled, 10, false, floors{fresh: freshWalk{from: math.MaxInt64}, keyed: math.MaxInt64}, nil)
		conn.Exec(ctx, `ROLLBACK`) //nolint:errcheck // nothing to keep
		conn.Release()
		if err != nil {
			t.Fatal(err)
		}
		if snap.owedLow > 0 != tc.unkeyed || snap.owedKeyedLow > 0 != tc.keyed {
			t.Errorf("%s: the owed table's lowest rows %d (unkeyed), %d (keyed): want the rows parked for amqp found %v, %v",
				tc.name, snap.owedLow, snap.owedKeyedLow, tc.unkeyed, tc.keyed)
		}
	}
}

// A claim's snapshot lists the running transactions below its xmax only, one
// past the newest ended. X, begun after Y, is above it when Y takes its
// row's id after X's and commits first: the claim takes Y's row over X's.
// The floors remember X all the same, and the claims after its commit take
// its row. (Another test's commit between Y's and the claim puts X in the
// list instead: the run then checks the listed case.)
func TestFloorsRememberTransactionsFromXmaxUp(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed %v", keyed), func(t *testing.T) {
			ctx := context.Background()
			f := setupOwnDatabase(t)
			st, cf := newStore(f.table), newClaimFloor(10, time.Hour)
			ins := `INSERT INTO ` + f.table.Ident() + ` (topic, payload, key) VALUES ('orders.created', '\x00', $1) RETURNING id`
			var key any
			if keyed {
				key = "k"
			}
			scan := func(row pgx.Row) (v int64) {
				t.Helper()
				if err := row.Scan(&v); err != nil {
					t.Fatal(err)
				}
				return v
			}
			y, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer y.Rollback(ctx) //nolint:errcheck // committed below
			scan(y.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`))
			x, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer x.Rollback(ctx) //nolint:errcheck // committed below
			xRow := scan(x.QueryRow(ctx, ins, key))
			xID := scan(x.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`))
			yRow := scan(y.QueryRow(ctx, ins, nil))
			if err := y.Commit(ctx); err != nil {
				t.Fatal(err)
			}

			fl := cf.begin(time.Now(), dualWrite)
			conn, err := f.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rows, snap, err := st.claim(ctx, conn, dualWrite, dualWrite, 10, false, fl, nil)
			if err != nil {
				t.Fatal(err)
			}
			cf.claimed(rows, fl, snap, time.Millisecond)
			cf.end(fl, true)
			conn.Exec(ctx, `ROLLBACK`) //nolint:errcheck // the floors only
			conn.Release()
			t.Logf("X %d (row %d), Y's row %d: xmax %d, listed %v, the claim's id %d", xID, xRow, yRow, snap.xmax, snap.xip, snap.xid)
			if _, ok := cf.fresh.pending[xID]; !ok || cf.fresh.safe < yRow {
				t.Fatalf("the floor at %d past Y's row %d, X not remembered (%v)", cf.fresh.safe, yRow, cf.fresh.pending)
			}
			if _, ok := cf.keyed.pending[xID]; keyed && !ok {
				t.Fatalf("the keyed floor at %d, X not remembered (%v)", cf.keyed.floor, cf.keyed.pending)
			}
			if err := x.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			for range 3 { // the claim that sees X ended, and the one that walks its gap
				for _, c := range claimWith(t, f.pool, st, cf, cf.begin(time.Now(), dualWrite), dualWrite, dualWrite, 10) {
					if c.msg.ID == xRow {
						return
					}
				}
			}
			t.Fatalf("X's row %d left behind the floors (fresh %d, keyed %d)", xRow, cf.fresh.safe, cf.keyed.floor)
		})
	}
}

// A row the recheck passed while its transaction ran, and that another
// relay's batch holds when this relay walks the gap its commit left: when
// that batch rolls back (its relay died), the claims or the next recheck
// take the row, not the walk from the oldest row minutes later. A near gap
// is walked by the next claim, which sends the recheck back to it; a far
// one by a sweep, which hands the recheck the rows it saw held.
func TestARowAnotherBatchHeldInAGapIsTakenOnceItRollsBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after int // rows committed after X's while X runs
		sweep bool
	}{
		{"a near gap", 3, false},
		{"a far gap", foldSpan + 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setupOwnDatabase(t)
			st, cf := newStore(f.table), newClaimFloor(2*foldSpan, time.Hour)
			ins := `INSERT INTO ` + f.table.Ident() + ` (topic, payload) VALUES ('orders.created', '\x00') RETURNING id`
			claim := func() (ids []int64, sweep bool) { // a batch every target confirmed
				t.Helper()
				sweep = cf.sweepDue(time.Now())
				for _, c := range claimAndRecord(t, f, st, cf, dualWrite, dualWrite, outcomeDelivered) {
					ids = append(ids, c.msg.ID)
				}
				return ids, sweep
			}
			one := func() {
				t.Helper()
				if _, err := f.pool.Exec(ctx, ins); err != nil {
					t.Fatal(err)
				}
			}
			x, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer x.Rollback(ctx) //nolint:errcheck // committed below
			var r int64
			if err := x.QueryRow(ctx, ins).Scan(&r); err != nil {
				t.Fatal(err)
			}
			one()
			claim()
			if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload)
				SELECT 'orders.created', '\x00' FROM generate_series(1, @n)`, pgx.NamedArgs{"n": tc.after}); err != nil {
				t.Fatal(err)
			}
			claim()
			// A transaction anywhere in the cluster that ended meanwhile may
			// leave a far gap, whose sweep goes before the recheck.
			for range 3 {
				cf.fresh.lastRecheck = time.Time{}
				if claim(); cf.fresh.rechecked >= r {
					break
				}
			}
			if cf.fresh.rechecked < r {
				t.Fatalf("no recheck past row %d (rechecked %d)", r, cf.fresh.rechecked)
			}
			if err := x.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			one()
			claim() // sees X ended: its rows are a gap
			b, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Rollback(ctx) //nolint:errcheck // rolled back below
			if _, err := b.Exec(ctx, `SELECT id FROM `+f.table.Ident()+` WHERE id = $1 FOR UPDATE`, r); err != nil {
				t.Fatal(err)
			}
			one()
			if got, sweep := claim(); slices.Contains(got, r) || sweep != tc.sweep {
				t.Fatalf("the gap's walk (a sweep: %v, want %v) took row %d, which another batch holds: %v", sweep, tc.sweep, r, slices.Contains(got, r))
			}
			if err := b.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				one()
				if got, _ := claim(); slices.Contains(got, r) {
					return
				}
			}
			cf.fresh.lastRecheck = time.Time{}
			if got, _ := claim(); !slices.Contains(got, r) {
				t.Fatalf("row %d, its batch rolled back, taken by neither the claims nor the recheck (gaps %v, rechecked %d, held %v, pending %v)",
					r, cf.fresh.gaps, cf.fresh.rechecked, cf.fresh.held, cf.fresh.pending)
			}
		})
	}
}
