package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
			if _, err := tx.Exec(context.Background(), `SELECT 1 FROM `+f.table.Ident()+` WHERE message_id = $1 FOR UPDATE`, id); err != nil {
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
			claimed: func(int, int64) {
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

// At a steady rate (every claim short), claims start past the rows known to
// be taken instead of walking from the oldest row over the rows the batches
// in flight hold — yet a row whose transaction took a lower id and commits
// after later rows were delivered is taken at once, not by the walk from
// the oldest row every PollInterval (an hour here).
func TestShortClaimsFloorFollowsCommittedTransactions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var mu sync.Mutex
	var floors []int64
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: time.Hour}, func(r *Relay) {
		r.floor.quickWalk = time.Hour // only the floor may find the late row
		r.hooks = &testHooks{claimed: func(_ int, floor int64) {
			mu.Lock()
			floors = append(floors, floor)
			mu.Unlock()
		}}
	})
	lastFloor := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return floors[len(floors)-1]
	}
	testenv.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(floors) >= 3 }, "relay did not start")

	// A producer's transaction takes an id and stays open...
	late, err := f.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(context.Background()) //nolint:errcheck // committed below
	var lateID int64
	if err := late.QueryRow(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.late', '\x00') RETURNING id`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	// ...while later rows commit and are delivered one claim at a time.
	for i := range 10 {
		f.insert(1, "orders.created")
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == i+1 }, "row not delivered")
	}
	if fl := lastFloor(); fl >= lateID {
		t.Fatalf("floor %d passed row %d while its transaction was still open", fl, lateID)
	}
	if err := late.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == 11 }, "the late row was not taken after its commit")

	// Once no transaction that was open at those claims still is, the floor
	// rises past the delivered rows. A transaction open anywhere in the
	// cluster (the other tests share it) holds the floor back while it
	// lasts, so the rows keep coming until then.
	done := 11
	testenv.Eventually(t, time.Minute, func() bool {
		f.insert(1, "orders.created")
		done++
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done }, "row not delivered")
		time.Sleep(20 * time.Millisecond)
		return lastFloor() > lateID
	}, "claims still start at or below row %d, delivered long ago: the floor does not follow committed transactions", lateID)
	mu.Lock()
	t.Logf("late row %d; floors %v", lateID, floors)
	mu.Unlock()
}

// A row whose transaction took its id before a claim's snapshot but its
// transaction id after it is one no snapshot shows coming: the floor rises
// past it before it commits. At a steady rate (the walk from the oldest row
// is cheap) that walk comes every quickWalk, so the row is taken within
// about that, not at the next PollInterval (an hour here). What counts as
// cheap is raised from cheapWalkTook to a second: under -race, beside the
// other packages' tests on a slow host, a walk over a handful of rows took
// more than 20 ms, the walks from the oldest row stopped (by design: a slow
// walk waits for the next PollInterval) and the test failed on the machine,
// not on the mechanism.
func TestRowBehindTheFloorWithoutTransactionIDIsTakenSoon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var mu sync.Mutex
	var floor int64
	var claims int
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: time.Hour}, func(r *Relay) {
		r.floor.cheapTook = time.Second
		r.hooks = &testHooks{claimed: func(_ int, fl int64) {
			mu.Lock()
			floor, claims = max(floor, fl), claims+1
			mu.Unlock()
		}}
	})
	testenv.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return claims >= 3 }, "relay did not start")

	// A producer's transaction takes an id and no transaction id yet
	// (nextval assigns one only when it logs the sequence, every 32 values:
	// then try again).
	var gap pgx.Tx
	var gapID int64
	for attempt := 0; ; attempt++ {
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var noXID bool
		if err := tx.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'id')), pg_current_xact_id_if_assigned() IS NULL`,
			f.table.Ident()).Scan(&gapID, &noXID); err != nil {
			t.Fatal(err)
		}
		if noXID {
			gap = tx
			break
		}
		tx.Rollback(ctx) //nolint:errcheck // try again
		if attempt == 5 {
			t.Fatal("nextval assigned a transaction id every time")
		}
	}
	defer gap.Rollback(ctx) //nolint:errcheck // committed below
	// Later rows commit and are delivered until the floor is past its id.
	done := 0
	testenv.Eventually(t, time.Minute, func() bool {
		f.insert(1, "orders.created")
		done++
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == done }, "row not delivered")
		mu.Lock()
		defer mu.Unlock()
		return floor > gapID
	}, "the floor never passed row %d", gapID)

	var gapMsg string
	if err := gap.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (id, topic, payload) OVERRIDING SYSTEM VALUE
		VALUES ($1, 'orders.gap', '\x00') RETURNING message_id::text`, gapID).Scan(&gapMsg); err != nil {
		t.Fatal(err)
	}
	if err := gap.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	// Other rows keep coming, as at a steady rate.
	for {
		if got, _ := n.count(gapMsg); got == 1 {
			break
		}
		if time.Since(committed) > 5*time.Second {
			t.Fatalf("row %d behind the floor not taken %v after its commit", gapID, time.Since(committed).Round(time.Millisecond))
		}
		f.insert(1, "orders.created")
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("row %d behind the floor taken %v after its commit", gapID, time.Since(committed).Round(time.Millisecond))
	testenv.Eventually(t, 10*time.Second, func() bool { got, _ := a.count(gapMsg); return got == 1 }, "amqp never got the row behind the floor")
}
