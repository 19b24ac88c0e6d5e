package relay

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
)

// A broker that takes every publish but confirms none (a blackhole) pauses
// its target without holding the other one back, and never marks anything
// delivered.
func TestUnconfirmedTargetNeverMarkedAndDoesNotBlockOther(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	n.setFail(func(*Message) error { return Unavailable(context.DeadlineExceeded) })
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 20})
	ids := f.insert(400, "orders.created")
	testenv.Eventually(t, 20*time.Second, func() bool { return a.total() == len(ids) }, "amqp held back by a failing nats")
	var natsDelivered int
	f.pool.QueryRow(context.Background(), `SELECT count(nats_delivered_at) FROM `+f.table.Owed()).Scan(&natsDelivered)
	if natsDelivered != 0 {
		t.Fatalf("%d rows marked delivered to nats, none was confirmed", natsDelivered)
	}
	n.setFail(nil)
	testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == len(ids) }, "nats did not recover")
}

// A row is never re-sent to a broker that confirmed it, however often the
// other broker makes it retry.
func TestConfirmedTargetNotResentOnOtherTargetsRetries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var mu sync.Mutex
	fails := 0
	n.setFail(func(*Message) error {
		mu.Lock()
		defer mu.Unlock()
		if fails < 3 {
			fails++
			return errors.New("nats: stream busy") // per-message, retried with backoff
		}
		return nil
	})
	ids := f.insert(1, "orders.created")
	// Retries 200-400 ms apart: long enough to see the state between them.
	f.start(Config{Sinks: []Sink{a, n}, RetryMin: 400 * time.Millisecond, RetryMax: 400 * time.Millisecond})
	// While JetStream owes the row, the outbox keeps its attempts and last
	// error, and RabbitMQ's delivery.
	testenv.Eventually(t, 10*time.Second, func() bool {
		s := f.state(ids[0])
		return !s.done && s.amqpDelivered && s.amqpAttempts == 1 && s.natsAttempts >= 1 && strings.Contains(s.natsErr, "stream busy")
	}, "no retry state recorded")
	testenv.Eventually(t, 20*time.Second, func() bool { return f.state(ids[0]).done }, "row not done")
	if s := f.state(ids[0]); !s.amqpDelivered || !s.natsDelivered {
		t.Fatalf("state %+v: want delivered to both", s)
	}
	if ga, ta := a.count(ids[0]); ga != 1 || ta != 1 {
		t.Fatalf("amqp got/tried %d/%d times, want 1/1", ga, ta)
	}
	if gn, tn := n.count(ids[0]); gn != 1 || tn != 4 {
		t.Fatalf("nats got/tried %d/%d times, want 1/4", gn, tn)
	}
}

// A row that can never be published is parked with its reason, per target,
// and the rows after it flow.
func TestPermanentErrorsPark(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	n.setFail(func(m *Message) error {
		if m.Topic == "bad topic" {
			return Permanent("nats: topic is not a valid subject")
		}
		return nil
	})
	bad := f.insert(1, "bad topic")[0]
	var badHeaders string
	err := f.pool.QueryRow(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, payload, headers) VALUES ('orders.x', '\x00', '{"n": 1}') RETURNING message_id::text`).Scan(&badHeaders)
	if err != nil {
		t.Fatal(err)
	}
	good := f.insert(100, "orders.created")
	f.start(Config{Sinks: []Sink{a, n}})
	testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == len(good) }, "good rows held up by bad ones")

	testenv.Eventually(t, 5*time.Second, func() bool { return f.state(bad).natsParked }, "bad topic not parked")
	if s := f.state(bad); !s.amqpDelivered || s.done || !strings.Contains(s.natsErr, "not a valid subject") {
		t.Fatalf("bad topic row: %+v, want amqp delivered, nats parked with reason, not done", s)
	}
	s := f.state(badHeaders)
	if !s.amqpParked || !s.natsParked || !strings.Contains(s.amqpErr, `value of "n" is not a string`) {
		t.Fatalf("bad headers row: %+v, want parked on both targets with the reason", s)
	}
	if _, tries := a.count(badHeaders); tries != 0 {
		t.Fatalf("bad headers row was published %d times", tries)
	}
	// Parked rows are not retried.
	_, before := n.count(bad)
	time.Sleep(200 * time.Millisecond) // several poll intervals, to see that nothing happens
	if _, after := n.count(bad); after != before {
		t.Fatalf("parked row retried: %d -> %d tries", before, after)
	}
}

// The delivered record says whether RabbitMQ may have the row: delivered
// to it, or published to it at least once (an attempt, or an outage such as
// a confirm that never came). Only such rows can be in the legacy queue, and
// only they enter the message_id index that the backfill reads (migration
// 00006): in the nats-only phase, rows RabbitMQ never saw stay out of it.
func TestDeliveredRecordSaysWhetherRabbitMQMayHaveTheRow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ids := f.insert(4, "orders.created")
	// History from the dual-write phase: RabbitMQ had ids[1]; ids[2] waited
	// for a confirm that never came; ids[3] failed once.
	for i, set := range []string{
		"",
		"amqp_delivered_at = now()",
		"amqp_last_error = 'amqp: no confirm: context deadline exceeded'",
		"amqp_attempts = 1, amqp_last_error = 'amqp: nacked by broker'",
	} {
		if set == "" {
			continue
		}
		f.setRow(ids[i], set)
	}
	n := newFake(TargetNATS)
	_, cancel, done := f.start(Config{Sinks: []Sink{n}})
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(ids) }, "nats-only phase did not finish")
	cancel()
	<-done
	want := map[string]bool{ids[0]: false, ids[1]: true, ids[2]: true, ids[3]: true}

	// Dual write and legacy only: RabbitMQ has every row.
	for _, sinks := range [][]Sink{{newFake(TargetAMQP), newFake(TargetNATS)}, {newFake(TargetAMQP)}} {
		more := f.insert(3, "orders.created")
		_, cancel, done := f.start(Config{Sinks: sinks})
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(want)+len(more) }, "phase did not finish")
		cancel()
		<-done
		for _, id := range more {
			want[id] = true
		}
	}

	rows, err := f.pool.Query(ctx, `SELECT message_id::text, amqp_sent FROM `+f.table.Delivered())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for rows.Next() {
		var id string
		var sent bool
		if err := rows.Scan(&id, &sent); err != nil {
			t.Fatal(err)
		}
		got[id] = sent
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("amqp_sent by message id:\n got %v\nwant %v", got, want)
	}
}

// A row that keeps failing for one target is parked after MaxAttempts, with
// the last error; failures of the broker itself never count toward it.
func TestMaxAttemptsParksButOutagesDoNotCount(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	a.setFail(func(m *Message) error { return errors.New("amqp: returned unroutable: 312 NO_ROUTE") })
	var outages sync.Map
	n.setFail(func(m *Message) error {
		// Each row meets 5 outages before NATS takes it.
		c, _ := outages.LoadOrStore(m.MessageID, new(int))
		if p := c.(*int); *p < 5 {
			*p++
			return Unavailable(errors.New("nats: disconnected"))
		}
		return nil
	})
	ids := f.insert(3, "orders.created")
	f.start(Config{Sinks: []Sink{a, n}, MaxAttempts: 3, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond})
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, id := range ids {
			if s := f.state(id); !s.amqpParked || !s.natsDelivered {
				return false
			}
		}
		return true
	}, "rows not parked for amqp / delivered to nats")
	for _, id := range ids {
		s := f.state(id)
		if s.amqpAttempts != 3 || !strings.Contains(s.amqpErr, "gave up after 3 attempts") || !strings.Contains(s.amqpErr, "NO_ROUTE") {
			t.Fatalf("amqp: %+v, want parked after 3 attempts with the last error", s)
		}
		if s.natsParked || s.natsAttempts != 1 {
			t.Fatalf("nats: %+v, want delivered with 1 counted attempt (5 outages not counted)", s)
		}
	}
}

// A refusal for want of room (a full stream) neither counts as an attempt
// nor pauses the target: rows wait, retried, and go once the broker has
// room; a batch of nothing but such refusals leaves the target ready (one
// full subject must not hold up the others).
func TestOutOfRoomNeitherParksNorPauses(t *testing.T) {
	t.Parallel()
	f := setup(t)
	n := newFake(TargetNATS)
	full := errors.New("nats: API error: code=503 err_code=10077 description=maximum messages exceeded")
	var room atomic.Bool
	n.setFail(func(*Message) error {
		if room.Load() {
			return nil
		}
		return OutOfRoom(full)
	})
	ids := f.insert(3, "orders.created")
	r, _, _ := f.start(Config{Sinks: []Sink{n}, MaxAttempts: 1, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond})
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, id := range ids {
			if _, tries := n.count(id); tries < 3 {
				return false
			}
		}
		return true
	}, "rows not retried")
	if u := r.Unready(); len(u) > 0 {
		t.Fatalf("target paused by refusals for room: %v", u)
	}
	for _, id := range ids {
		if s := f.state(id); s.natsParked || s.natsAttempts != 0 || !strings.Contains(s.natsErr, "maximum messages exceeded") {
			t.Fatalf("%+v: want not parked, no attempt counted, the refusal as the last error", s)
		}
	}
	room.Store(true)
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(ids) }, "rows not delivered once there was room")
}

// Refusals for room have no say in pausing a target: a batch whose other
// publishes all failed for want of the broker pauses it still.
func TestOutOfRoomLeavesTheBreakerToTheOthers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	n := newFake(TargetNATS)
	n.setFail(func(m *Message) error {
		if m.ID%2 == 0 {
			return OutOfRoom(errors.New("maximum messages exceeded"))
		}
		return Unavailable(errors.New("nats: timeout"))
	})
	f.insert(4, "orders.created")
	// Each row tried once: the first batch decides.
	r, _, _ := f.start(Config{Sinks: []Sink{n}, RetryMin: time.Hour, RetryMax: time.Hour})
	testenv.Eventually(t, 30*time.Second, func() bool { return len(r.Unready()) > 0 }, "target not paused by a batch of outages and refusals for room")
}

// A refusal for room is an answer: after an outage, a batch refused for
// room closes the breaker, and the target is ready again.
func TestOutOfRoomEndsAPause(t *testing.T) {
	t.Parallel()
	f := setup(t)
	n := newFake(TargetNATS)
	var room atomic.Bool // false: an outage; true: refused for room
	n.setFail(func(*Message) error {
		if room.Load() {
			return OutOfRoom(errors.New("maximum messages exceeded"))
		}
		return Unavailable(errors.New("nats: timeout"))
	})
	f.insert(4, "orders.created")
	r, _, _ := f.start(Config{Sinks: []Sink{n}, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond})
	testenv.Eventually(t, 30*time.Second, func() bool { return len(r.Unready()) > 0 }, "target not paused by the outage")
	room.Store(true)
	testenv.Eventually(t, 30*time.Second, func() bool { return len(r.Unready()) == 0 }, "target still paused while the broker answers, refusing for room")
}

// In dual write with both brokers healthy, each row goes to both in one
// batch and is written once: JetStream's claims do not run ahead of
// RabbitMQ's (which would claim and rewrite every row twice).
func TestDualWriteRecordsEachRowOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	const rows = 2000
	f.insertKeyed(50, rows/2/50)
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, payload)
		SELECT 'orders.u', '\x00' FROM generate_series(1, @rows)`, pgx.NamedArgs{"rows": rows / 2}); err != nil {
		t.Fatal(err)
	}
	// Log every update and delete of a row, and every move to the owed table.
	sch := `"` + f.table.Schema + `"`
	if _, err := f.pool.Exec(context.Background(), `
		CREATE TABLE `+sch+`.updates (id bigint NOT NULL, op text NOT NULL);
		CREATE FUNCTION `+sch+`.log_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO `+sch+`.updates VALUES (coalesce(OLD.id, NEW.id), TG_OP); RETURN NULL; END $$;
		CREATE TRIGGER log_update AFTER UPDATE OR DELETE ON `+f.table.Ident()+` FOR EACH ROW EXECUTE FUNCTION `+sch+`.log_update();
		CREATE TRIGGER log_update AFTER INSERT OR UPDATE OR DELETE ON `+f.table.Owed()+` FOR EACH ROW EXECUTE FUNCTION `+sch+`.log_update();`); err != nil {
		t.Fatal(err)
	}
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 100, Workers: 4})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == rows }, "rows not all done")
	// Each row is written once: deleted (and recorded delivered) by the
	// batch that had both confirms, never updated first.
	var writes, deletes, twice int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE op = 'DELETE'), count(*) - count(DISTINCT id) FROM `+sch+`.updates`).
		Scan(&writes, &deletes, &twice); err != nil {
		t.Fatal(err)
	}
	if writes != rows || deletes != rows || twice != 0 {
		t.Fatalf("%d row writes (%d deletes) for %d rows (%d rows written more than once): want each row deleted once, nothing else", writes, deletes, rows, twice)
	}
	// Keyed and unkeyed rows share a batch: RabbitMQ never gets more than
	// BatchSize rows of one (the bound on re-sends after a crash).
	if a.most > 100 {
		t.Fatalf("a batch published %d rows to RabbitMQ, more than BatchSize 100", a.most)
	}
}

// roundTrips counts the round trips to Postgres whose statements match: a
// statement run on its own is one, a pgx batch is one.
type roundTrips struct {
	match func(sql string) bool
	n     atomic.Int64
}

func (rt *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if rt.match(d.SQL) {
		rt.n.Add(1)
	}
	return ctx
}

func (rt *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (rt *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if rt.match(q.SQL) {
			rt.n.Add(1)
			break
		}
	}
	return ctx
}

func (rt *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (rt *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A batch costs two round trips to Postgres: begin and claim together, and
// record and commit together. At a few rows a batch, round trips are most
// of the relay's and Postgres's work.
func TestBatchTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// The statements as pgx sends them, their parameters numbered.
	claimSQL, _ := outboxsql.Positional(newStore(f.table).sql.Claim)
	recordSQL, _ := outboxsql.Positional(newStore(f.table).sql.Record)
	rt := &roundTrips{match: func(sql string) bool {
		up := strings.ToUpper(sql)
		return strings.HasPrefix(up, "BEGIN") || up == "COMMIT" || up == "ROLLBACK" || sql == claimSQL || sql == recordSQL
	}}
	pc, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = rt
	traced, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	f.pool = traced

	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var claims atomic.Int64
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 1, PollInterval: time.Hour}, func(r *Relay) {
		r.hooks = &testHooks{claimed: func(int, floors) { claims.Add(1) }}
	})
	testenv.Eventually(t, 10*time.Second, func() bool { return claims.Load() >= 2 }, "relay did not start")
	time.Sleep(100 * time.Millisecond)

	// Single-row commits, one at a time: a batch of one row each.
	const commits = 20
	trips0, claims0 := rt.n.Load(), claims.Load()
	for i := range commits {
		f.insert(1, "orders.created")
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == i+1 }, "row not delivered")
	}
	trips, batches := rt.n.Load()-trips0, claims.Load()-claims0
	// Each commit's batch, plus any empty claim (its commit is a round trip
	// of its own).
	if batches < commits || trips > 2*batches+(batches-commits) {
		t.Errorf("%d round trips for %d claims delivering %d single-row commits: want 2 a batch", trips, batches, commits)
	}
	t.Logf("%d round trips, %d claims, %d commits", trips, batches, commits)
}
