package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check outlives a closed pool briefly.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// fakeSink is a broker stand-in for tests of the loop: it records what it
// was asked to publish and fails on demand. Integration tests use the real
// brokers.
type fakeSink struct {
	target Target
	mu     sync.Mutex
	got    map[string]int // message id -> publishes confirmed
	tries  map[string]int // message id -> publish calls
	order  []int64        // row ids in the order they were confirmed
	down   error          // Ready's answer
	fail   func(*Message) error
	most   int // the most messages one Publish call was given
}

func newFake(t Target) *fakeSink {
	return &fakeSink{target: t, got: map[string]int{}, tries: map[string]int{}}
}

func (f *fakeSink) Target() Target { return f.target }

func (f *fakeSink) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

func (f *fakeSink) setDown(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = err
}

func (f *fakeSink) setFail(fn func(*Message) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = fn
}

func (f *fakeSink) Publish(_ context.Context, msgs []*Message, results []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.most = max(f.most, len(msgs))
	for i, m := range msgs {
		f.tries[m.MessageID]++
		if f.down != nil {
			results[i] = f.down
			continue
		}
		if f.fail != nil {
			if err := f.fail(m); err != nil {
				results[i] = err
				continue
			}
		}
		f.got[m.MessageID]++
		f.order = append(f.order, m.ID)
	}
}

func (f *fakeSink) confirmedOrder() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.order...)
}

func (f *fakeSink) count(id string) (got, tries int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got[id], f.tries[id]
}

func (f *fakeSink) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.got {
		n += c
	}
	return n
}

type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	table schema.Table
}

func setup(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.Pool(t)
	return &fixture{t: t, pool: pool, table: testenv.Outbox(t, pool)}
}

// fill bulk-inserts n small unkeyed rows.
func (f *fixture) fill(n int) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.table.Ident()+`
		(topic, payload) SELECT 'orders.created', '\x00' FROM generate_series(1, $1)`, n); err != nil {
		f.t.Fatal(err)
	}
}

// noAutovacuum keeps autovacuum (and its ANALYZE) off the table, so the
// planner knows only what the test lets it.
func (f *fixture) noAutovacuum() {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), `ALTER TABLE `+f.table.Ident()+` SET (autovacuum_enabled = false)`); err != nil {
		f.t.Fatal(err)
	}
}

// insert writes n rows with plain SQL, as any producer may, and returns
// their message ids.
func (f *fixture) insert(n int, topic string) []string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(),
		`INSERT INTO `+f.table.Ident()+` (topic, payload, headers)
		 SELECT $1, convert_to('p' || g, 'UTF8'), '{"traceparent":"00-1-2-01"}' FROM generate_series(1, $2) g
		 RETURNING message_id::text`, topic, n)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		rows.Scan(&id)
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return ids
}

// start runs a relay until the test ends.
func (f *fixture) start(cfg Config) (*Relay, context.CancelFunc, <-chan struct{}) {
	f.t.Helper()
	return f.startWith(cfg, nil)
}

// startWith is start with prepare (when not nil) run on the relay before it
// starts: to set test hooks.
func (f *fixture) startWith(cfg Config, prepare func(*Relay)) (*Relay, context.CancelFunc, <-chan struct{}) {
	f.t.Helper()
	cfg.Table = f.table
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 100*time.Millisecond
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = 2 * time.Second
	}
	r, err := New(f.pool, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	if prepare != nil {
		prepare(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	f.t.Cleanup(func() { cancel(); <-done })
	return r, cancel, done
}

// setRow sets one row's columns: set is the SET list, a test's own.
func (f *fixture) setRow(id, set string) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), `UPDATE `+f.table.Ident()+` SET `+set+` WHERE message_id = $1`, id); err != nil {
		f.t.Fatal(err)
	}
}

// state reads one row's delivery columns.
type rowState struct {
	amqpDelivered, natsDelivered, done bool
	amqpParked, natsParked             bool
	amqpAttempts, natsAttempts         int
	amqpErr, natsErr                   string
}

// state is a row's delivery state: from the outbox while a target still
// owes it, else from the delivered table (done; attempts and errors are not
// kept there).
func (f *fixture) state(id string) rowState {
	f.t.Helper()
	var s rowState
	var ae, ne *string
	err := f.pool.QueryRow(context.Background(), `SELECT amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL, done_at IS NOT NULL,
		amqp_parked_at IS NOT NULL, nats_parked_at IS NOT NULL, amqp_attempts, nats_attempts, amqp_last_error, nats_last_error
		FROM `+f.table.Ident()+` WHERE message_id = $1`, id).
		Scan(&s.amqpDelivered, &s.natsDelivered, &s.done, &s.amqpParked, &s.natsParked, &s.amqpAttempts, &s.natsAttempts, &ae, &ne)
	if errors.Is(err, pgx.ErrNoRows) {
		s.done = true
		err = f.pool.QueryRow(context.Background(), `SELECT amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL
			FROM `+f.table.Delivered()+` WHERE message_id = $1`, id).Scan(&s.amqpDelivered, &s.natsDelivered)
	}
	if err != nil {
		f.t.Fatal(err)
	}
	if ae != nil {
		s.amqpErr = *ae
	}
	if ne != nil {
		s.natsErr = *ne
	}
	return s
}

// countDone counts the rows every enabled target has: those recorded in the
// delivered table, and gone from the outbox. It fails the test if a row is
// in both.
func (f *fixture) countDone() int {
	f.t.Helper()
	var n, both int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*), count(o.id) FROM `+f.table.Delivered()+` d
		LEFT JOIN `+f.table.Ident()+` o ON o.id = d.id`).Scan(&n, &both); err != nil {
		f.t.Fatal(err)
	}
	if both != 0 {
		f.t.Fatalf("%d rows recorded delivered are still in the outbox", both)
	}
	return n
}

func TestDeliversEveryRowOncePerTarget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	ids := f.insert(3000, "orders.created")
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 100, Workers: 4})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(ids) }, "rows not all done")
	for _, id := range ids {
		if ga, _ := a.count(id); ga != 1 {
			t.Fatalf("amqp got %s %d times", id, ga)
		}
		if gn, _ := n.count(id); gn != 1 {
			t.Fatalf("nats got %s %d times", id, gn)
		}
	}
}

// With one broker down, the other keeps flowing; the down one is not even
// tried, and catches up once back.
func TestTargetsProgressIndependently(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	n.setDown(Unavailable(errors.New("nats: disconnected")))
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 50})
	ids := f.insert(500, "orders.created")
	testenv.Eventually(t, 20*time.Second, func() bool { return a.total() == len(ids) }, "amqp did not get every row while nats was down")
	for _, id := range ids[:10] {
		if s := f.state(id); !s.amqpDelivered || s.natsDelivered || s.done {
			t.Fatalf("row %s: %+v, want amqp delivered only", id, s)
		}
		if _, tries := n.count(id); tries != 0 {
			t.Fatalf("nats was tried %d times while not ready", tries)
		}
	}
	n.setDown(nil)
	testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == len(ids) }, "nats did not catch up")
	for _, id := range ids {
		if ga, _ := a.count(id); ga != 1 {
			t.Fatalf("amqp got %s %d times, want once", id, ga)
		}
	}
}

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

// A phase change leaves rows that reached the target that stays while the
// one dropped still owed them (in retry, or parked): no batch claims them
// (they are owed to no enabled target), so the relay's cleanup finishes them
// — gone from the outbox, recorded as delivered — and leaves alone the rows
// the remaining target still owes.
func TestPhaseChangeFinishesStrandedRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.insert(4, "orders.created")
	for i, set := range []string{
		"nats_delivered_at = now(), amqp_parked_at = now(), amqp_last_error = 'refused'",          // stranded
		"nats_delivered_at = now(), amqp_retry_at = now() + interval '1 hour'",                    // stranded
		"amqp_delivered_at = now(), nats_retry_at = now() + interval '1 hour', nats_attempts = 1", // still owed to nats
		"amqp_delivered_at = now(), nats_parked_at = now()",                                       // parked for nats
	} {
		f.setRow(ids[i], set)
	}
	n := newFake(TargetNATS)
	r, _, _ := f.start(Config{Sinks: []Sink{n}})
	if err := r.CleanupOnce(context.Background()); err != nil { // what the relay does every CleanupInterval
		t.Fatal(err)
	}
	for i, want := range []rowState{{natsDelivered: true, done: true}, {natsDelivered: true, done: true}} {
		if s := f.state(ids[i]); s != want {
			t.Errorf("row %d: %+v, want %+v", i, s, want)
		}
	}
	if s := f.state(ids[2]); s.done || s.natsDelivered {
		t.Errorf("row owed to nats: %+v, want still owed", s)
	}
	if s := f.state(ids[3]); s.done || !s.natsParked {
		t.Errorf("row parked for nats: %+v, want still parked", s)
	}
	if got := n.total(); got != 0 {
		t.Errorf("nats got %d publishes; the stranded rows are in it already, the others wait", got)
	}
}

// The sweep goes through one slice of the outbox a cleanup, round and
// round: a stranded row (here left by an instance still in dual write) is
// found within a round, and no cleanup scans a whole backlog.
func TestStrandedRowSweepGoesASliceAtATime(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.insert(35, "orders.created")
	tbl := f.table.Ident()
	// Pending for JetStream but not due: the relay leaves them be.
	if _, err := f.pool.Exec(context.Background(), `UPDATE `+tbl+` SET nats_retry_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	r, _, _ := f.startWith(Config{Sinks: []Sink{newFake(TargetNATS)}, CleanupInterval: time.Hour}, func(r *Relay) { r.sweep.slice = 10 })

	// Another instance, still in dual write, leaves the last row
	// delivered to JetStream, owed to RabbitMQ.
	f.setRow(ids[34], "nats_delivered_at = now(), nats_retry_at = NULL, amqp_retry_at = now() + interval '1 hour'")
	calls := 0
	for ; calls < 6 && !f.state(ids[34]).done; calls++ {
		if err := r.CleanupOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// 35 rows in slices of 10: from the start, the fourth slice has it.
	if calls != 4 || !f.state(ids[34]).done {
		t.Fatalf("finished after %d cleanups (done %v), want the fourth: a slice of 10 each", calls, f.state(ids[34]).done)
	}
	for _, id := range ids[:34] {
		if s := f.state(id); s.done {
			t.Fatalf("row %s finished, still owed to JetStream", id)
		}
	}
}

// Only the nats-only phase finishes such rows. In phase amqp a row RabbitMQ
// has and JetStream still owes stays: a move back from dual write keeps it
// for when dual write resumes, and during a move to dual write the
// instances still in phase amqp leave it to the dual-write ones.
func TestPhaseAMQPLeavesRowsJetStreamOwes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.insert(1, "orders.created")
	f.setRow(ids[0], "amqp_delivered_at = now(), nats_retry_at = now() + interval '1 hour'")
	r, _, _ := f.start(Config{Sinks: []Sink{newFake(TargetAMQP)}})
	if err := r.CleanupOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := f.state(ids[0]); s.done || !s.amqpDelivered {
		t.Fatalf("row %+v, want still in the outbox, owed to nats", s)
	}
}

// boundedFake is a fakeSink whose broker dedupes within a window
// (RetryBounder), as JetStream does.
type boundedFake struct {
	*fakeSink
	bound time.Duration
}

func (b boundedFake) RetryBound() time.Duration { return b.bound }

// A publish with an unknown outcome may have been stored: a broker that
// dedupes only within a window gets the row again inside it, however long
// the row's earlier failures made its backoff (here a minute: 1 s doubled
// for ten failures, capped at RetryMax).
func TestUnknownOutcomeRetriedWithinTheDedupeWindow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	n := newFake(TargetNATS)
	ids := f.insert(1, "orders.created")
	f.setRow(ids[0], "nats_attempts = 10")
	var once sync.Once
	n.setFail(func(*Message) error {
		var err error
		once.Do(func() { err = Unavailable(errors.New("nats: timeout")) })
		return err
	})
	f.start(Config{Sinks: []Sink{boundedFake{n, 300 * time.Millisecond}}, RetryMin: time.Second, RetryMax: time.Minute})
	testenv.Eventually(t, 10*time.Second, func() bool { return f.state(ids[0]).done }, "the row waited past the bound")
	if got, tries := n.count(ids[0]); got != 1 || tries != 2 {
		t.Fatalf("got/tried %d/%d, want 1/2", got, tries)
	}
}

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
	f.pool.QueryRow(context.Background(), `SELECT count(nats_delivered_at) FROM `+f.table.Ident()).Scan(&natsDelivered)
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

// Changing RELAY_TARGETS never re-sends: rows finished in the legacy-only
// phase are not replayed to JetStream when dual write starts; rows written
// afterwards go to both.
func TestPhaseChangeDoesNotResend(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a1 := newFake(TargetAMQP)
	old := f.insert(50, "orders.created")
	_, cancel, done := f.start(Config{Sinks: []Sink{a1}})
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(old) }, "legacy phase did not finish")
	cancel()
	<-done

	a2, n2 := newFake(TargetAMQP), newFake(TargetNATS)
	f.start(Config{Sinks: []Sink{a2, n2}})
	fresh := f.insert(50, "orders.created")
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(old)+len(fresh) }, "dual phase did not finish")
	if a2.total() != len(fresh) || n2.total() != len(fresh) {
		t.Fatalf("dual phase published amqp %d, nats %d; want only the %d new rows each", a2.total(), n2.total(), len(fresh))
	}
	for _, id := range old {
		if s := f.state(id); s.natsDelivered {
			t.Fatalf("legacy-phase row %s recorded as delivered to nats", id)
		}
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
		if _, err := f.pool.Exec(ctx, `UPDATE `+f.table.Ident()+` SET `+set+` WHERE message_id = $1`, ids[i]); err != nil {
			t.Fatal(err)
		}
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

// While a batch is in flight, the relay's next claims know its keyed rows
// (and do not try to lock them); once its transaction ends they are free.
func TestHeldKeyedRowsAreThoseOfBatchesInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keyOf := f.insertKeyed(4, 3)
	heads := map[string]int64{}
	for id, k := range keyOf {
		if h, ok := heads[k]; !ok || id < h {
			heads[k] = id
		}
	}
	var want []int64
	for _, id := range heads {
		want = append(want, id)
	}
	slices.Sort(want)
	r, err := New(f.pool, Config{Table: f.table, Sinks: []Sink{newFake(TargetAMQP)}, Workers: 1, BatchSize: 10, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var firstBatch []int64
	r.hooks = &testHooks{afterPublish: func() {
		mu.Lock()
		defer mu.Unlock()
		if firstBatch == nil {
			firstBatch = r.held.list()
			slices.Sort(firstBatch)
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(keyOf) }, "rows not delivered")
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(firstBatch, want) {
		t.Fatalf("held during the first batch: %v, want its rows, the keys' first rows %v", firstBatch, want)
	}
	if left := r.held.list(); len(left) != 0 {
		t.Fatalf("held after every batch ended: %v", left)
	}
}

// Soft stop: cancelling Run lets the in-flight batch finish and record.
func TestStopFinishesInFlightBatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := newFake(TargetAMQP)
	r, err := New(f.pool, Config{Table: f.table, Sinks: []Sink{a}, Workers: 1, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.hooks = &testHooks{afterPublish: func() {
		once.Do(func() { close(inFlight); <-release })
	}}
	ids := f.insert(10, "orders.created")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	<-inFlight
	cancel()
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	for _, id := range ids {
		if !f.state(id).amqpDelivered {
			t.Fatalf("row %s published but not recorded at stop", id)
		}
	}
}

// The record of delivered ids older than Retention is deleted, and so are
// rows marked done in the outbox before migration 00005; others stay.
func TestCleanupKeepsRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := newFake(TargetAMQP)
	r, err := New(f.pool, Config{Table: f.table, Sinks: []Sink{a}, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ids := f.insert(2500, "orders.created")
	ctx := context.Background()
	// 2100 rows finished two hours ago, 300 a minute ago, 100 not yet.
	exec := func(q string, args ...any) {
		if _, err := f.pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE `+f.table.Ident()+` SET amqp_delivered_at = now(), done_at = now() - interval '2 hours' WHERE message_id = ANY($1::uuid[])`, ids[:2100])
	exec(`UPDATE `+f.table.Ident()+` SET amqp_delivered_at = now(), done_at = now() - interval '1 minute' WHERE message_id = ANY($1::uuid[])`, ids[2100:2400])
	// The delivered table: 2300 ids recorded two hours ago, 200 a minute ago.
	exec(`INSERT INTO ` + f.table.Delivered() + ` (id, message_id, amqp_delivered_at, done_at)
		SELECT -g, gen_random_uuid(), now(), now() - CASE WHEN g <= 2300 THEN interval '2 hours' ELSE interval '1 minute' END
		FROM generate_series(1, 2500) g`)
	if err := r.CleanupOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var left, leftDone, leftDelivered int
	f.pool.QueryRow(ctx, `SELECT count(*), count(done_at), (SELECT count(*) FROM `+f.table.Delivered()+`) FROM `+f.table.Ident()).
		Scan(&left, &leftDone, &leftDelivered)
	if left != 400 || leftDone != 300 || leftDelivered != 200 {
		t.Fatalf("after cleanup: %d rows (%d done) and %d delivered ids, want 400 (300 done) and 200", left, leftDone, leftDelivered)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	a := newFake(TargetAMQP)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no sinks", Config{}, "no sinks"},
		{"two amqp", Config{Sinks: []Sink{a, newFake(TargetAMQP)}}, "two sinks"},
		{"unknown target", Config{Sinks: []Sink{newFake("kafka")}}, "unknown target"},
		{"batch", Config{Sinks: []Sink{a}, BatchSize: -1}, "BatchSize"},
		{"workers", Config{Sinks: []Sink{a}, Workers: 1000}, "Workers"},
		{"retry", Config{Sinks: []Sink{a}, RetryMin: time.Minute, RetryMax: time.Second}, "RetryMax"},
	} {
		if _, err := New(nil, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestParseTargets(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"amqp": "[amqp]", "nats": "[nats]", "amqp,nats": "[amqp nats]", "nats, amqp": "[amqp nats]",
	} {
		got, err := ParseTargets(in)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("ParseTargets(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "bogus", "amqp,amqp", "amqp,", "kafka,nats"} {
		if _, err := ParseTargets(in); err == nil {
			t.Errorf("ParseTargets(%q) accepted", in)
		}
	}
}

func TestRetryBackoffIsCappedExponential(t *testing.T) {
	t.Parallel()
	r := &Relay{cfg: Config{RetryMin: time.Second, RetryMax: time.Minute}}
	for attempt, want := range map[int32]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 7: time.Minute, 40: time.Minute} {
		for range 20 {
			if d := r.retryBackoff(attempt); d < want/2 || d > want {
				t.Fatalf("attempt %d: backoff %v, want within [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	var b breaker
	now := time.Now()
	if !b.allow(now) {
		t.Fatal("new breaker closed")
	}
	d1 := b.failure(now, "x")
	if d1 != 100*time.Millisecond || b.allow(now) || b.failure(now, "x") != 0 {
		t.Fatalf("first failure: open for %v; want 100ms, closed meanwhile, no double count", d1)
	}
	later := now.Add(d1)
	if !b.allow(later) {
		t.Fatal("breaker did not half-open after its wait")
	}
	if d2 := b.failure(later, "x"); d2 != 200*time.Millisecond {
		t.Fatalf("second failure: %v, want 200ms", d2)
	}
	for i := range 20 {
		later = later.Add(time.Hour)
		if d := b.failure(later, "x"); d > breakerMax {
			t.Fatalf("failure %d: %v over the cap", i, d)
		}
	}
	if !b.success() || !b.allow(later) {
		t.Fatal("success did not close the breaker")
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

// A row refused for want of room waits about half as long as its topic
// has been refused, between RetryMin and RetryMax (its attempts do not
// grow); the refusals of a topic run until the target stores one of its
// rows, per target and topic.
func TestRoomBackoffGrowsWithTheRefusal(t *testing.T) {
	t.Parallel()
	r := &Relay{cfg: Config{RetryMin: time.Second, RetryMax: 5 * time.Minute}}
	for refused, want := range map[time.Duration]time.Duration{0: time.Second, time.Second: time.Second, 10 * time.Second: 5 * time.Second, time.Minute: 30 * time.Second, time.Hour: 5 * time.Minute} {
		for range 20 {
			if d := r.roomBackoff(refused); d < want/2 || d > want {
				t.Fatalf("refused for %v: backoff %v, want within [%v, %v]", refused, d, want/2, want)
			}
		}
	}
	var f fullSince
	const stale = 10 * time.Minute
	t0 := time.Now()
	if got := f.refused(1, "a", t0, stale); !got.Equal(t0) {
		t.Fatalf("first refusal: since %v, want now", got)
	}
	if got := f.refused(1, "a", t0.Add(time.Minute), stale); !got.Equal(t0) {
		t.Fatalf("second refusal: since %v, want the first's %v", got, t0)
	}
	if got := f.refused(0, "a", t0.Add(time.Minute), stale); !got.Equal(t0.Add(time.Minute)) {
		t.Fatal("another target's refusals counted")
	}
	f.stored(1, "b")
	if got := f.refused(1, "a", t0.Add(2*time.Minute), stale); !got.Equal(t0) {
		t.Fatal("another topic's delivery ended the refusals")
	}
	f.stored(1, "a")
	t1 := t0.Add(3 * time.Minute)
	if got := f.refused(1, "a", t1, stale); !got.Equal(t1) {
		t.Fatalf("after a delivery: since %v, want a new run from now", got)
	}
	// No refusal for longer than stale (another instance stored the
	// topic's rows): the run is over.
	if got := f.refused(1, "a", t1.Add(stale+time.Second), stale); !got.Equal(t1.Add(stale + time.Second)) {
		t.Fatalf("after %v without a refusal: since %v, want a new run from now", stale, got)
	}
	// At the bound (both targets' runs), runs that are over make room.
	var g fullSince
	for i := range maxFullTopics {
		g.refused(i%2, fmt.Sprint(i), t0, stale)
	}
	late := t0.Add(stale + time.Second)
	if got := g.refused(0, "new", late, stale); !got.Equal(late) || g.n.Load() != 1 {
		t.Fatalf("at the bound with every run over: since %v, %d entries; want now and 1", got, g.n.Load())
	}
	if got := g.refused(0, "new", late.Add(time.Second), stale); !got.Equal(late) {
		t.Fatal("the new topic's run was not kept")
	}
}

// The headers column, whatever a producer put in it, decodes to a string
// map or a reason — never a panic, never a silent drop of a value.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"b"}`, `{"n":1}`, `[1]`, `null`, `{"a":{"b":"c"}}`, `{"a":null}`, `"x"`, `{"a":"\u0000"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		m, reason := decodeHeaders(raw)
		if reason == "" && m == nil {
			t.Fatalf("%q: neither headers nor a reason", raw)
		}
		if reason != "" && m != nil {
			t.Fatalf("%q: both headers and a reason", raw)
		}
	})
}

// insertKeyed writes n rows for each key, interleaved (k0 r0, k1 r0, ...,
// k0 r1, ...), and returns row id -> key.
func (f *fixture) insertKeyed(keys, n int) map[int64]string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, key, payload)
		SELECT 'orders.k', 'k' || (g % $1::int), '\x00' FROM generate_series(0, $1::int * $2::int - 1) g ORDER BY g RETURNING id, key`, keys, n)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var k string
		rows.Scan(&id, &k)
		out[id] = k
	}
	return out
}

// checkKeyOrder fails unless, per key, the confirmed row ids increase.
func checkKeyOrder(t *testing.T, name string, order []int64, keyOf map[int64]string) {
	t.Helper()
	last := map[string]int64{}
	for _, id := range order {
		k, ok := keyOf[id]
		if !ok {
			continue
		}
		if id <= last[k] {
			t.Fatalf("%s: key %s: row %d confirmed after row %d", name, k, id, last[k])
		}
		last[k] = id
	}
}

// Rows of one key reach each broker in id order across 4 workers, even when
// some fail and are retried; a key's failing row holds only that key.
func TestKeyOrderThroughRetries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var mu sync.Mutex
	failed := map[string]int{}
	flaky := func(m *Message) error {
		mu.Lock()
		defer mu.Unlock()
		// Every 7th row fails twice before it goes through.
		if m.ID%7 == 0 && failed[m.MessageID] < 2 {
			failed[m.MessageID]++
			return errors.New("nats: temporary refusal")
		}
		return nil
	}
	n.setFail(flaky)
	keyOf := f.insertKeyed(20, 30)
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 50, Workers: 4, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond})
	testenv.Eventually(t, 60*time.Second, func() bool { return f.countDone() == len(keyOf) }, "keyed rows not all done")
	checkKeyOrder(t, "amqp", a.confirmedOrder(), keyOf)
	checkKeyOrder(t, "nats", n.confirmedOrder(), keyOf)
}

// A parked row holds the later rows of its key (strict, the default) and no
// other key's; with SkipParkedKeys the later rows go past it.
func TestParkedRowHoldsItsKeyOnly(t *testing.T) {
	t.Parallel()
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprintf("skip=%v", skip), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			a := newFake(TargetAMQP)
			keyOf := f.insertKeyed(3, 5) // k0, k1, k2 x 5 rows
			var poison int64
			for id, k := range keyOf {
				if k == "k1" && (poison == 0 || id < poison) {
					poison = id
				}
			}
			a.setFail(func(m *Message) error {
				if m.ID == poison {
					return Permanent("amqp: refused")
				}
				return nil
			})
			f.start(Config{Sinks: []Sink{a}, SkipParkedKeys: skip})
			want := 10 // k0 and k2
			if skip {
				want = 14 // all but the poison row
			}
			testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == want }, "want %d rows done", want)
			time.Sleep(300 * time.Millisecond) // several poll intervals: held rows must stay held
			if got := f.countDone(); got != want {
				t.Fatalf("%d rows done, want %d", got, want)
			}
			for id, k := range keyOf {
				delivered, _ := a.count(idToMsg(t, f, id))
				switch {
				case id == poison && delivered != 0:
					t.Fatalf("poison row delivered")
				case k == "k1" && id != poison && !skip && delivered != 0:
					t.Fatalf("row %d of the held key delivered past its parked row", id)
				case k != "k1" && delivered != 1:
					t.Fatalf("row %d of an unrelated key delivered %d times", id, delivered)
				}
			}
			checkKeyOrder(t, "amqp", a.confirmedOrder(), keyOf)
			stats, err := ReadStats(context.Background(), f.pool, f.table, []Target{TargetAMQP})
			if err != nil {
				t.Fatal(err)
			}
			if stats[0].HeldKeys != 1 || stats[0].Parked != 1 {
				t.Fatalf("stats %+v: want 1 parked row holding 1 key", stats[0])
			}
		})
	}
}

func idToMsg(t *testing.T, f *fixture, id int64) string {
	t.Helper()
	var m string
	if err := f.pool.QueryRow(context.Background(), `SELECT message_id::text FROM `+f.table.Ident()+` WHERE id = $1
		UNION ALL SELECT message_id::text FROM `+f.table.Delivered()+` WHERE id = $1`, id).Scan(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A key held by a waiting row (parked, or its retry not due) may have far
// more later rows than a claim's keyed window: they must not crowd out the
// other keys behind them.
func TestHeldKeyLongerThanTheWindow(t *testing.T) {
	t.Parallel()
	for _, held := range []string{"parked", "retry"} {
		t.Run(held, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			a := newFake(TargetAMQP)
			const batch = 10 // window: keyWindow × 10 keyed rows
			hot := f.insertKeyed(1, 3*keyWindow*batch)
			var first int64
			for id := range hot {
				if first == 0 || id < first {
					first = id
				}
			}
			others := f.insertKeyed(5, 10) // keys k0..k4 again: k0 is the hot key
			for id, k := range others {
				if k == "k0" {
					hot[id] = k
					delete(others, id)
				}
			}
			a.setFail(func(m *Message) error {
				if m.ID != first {
					return nil
				}
				if held == "parked" {
					return Permanent("amqp: refused")
				}
				return errors.New("amqp: try later")
			})
			f.start(Config{Sinks: []Sink{a}, BatchSize: batch, Workers: 2, RetryMin: time.Hour, RetryMax: time.Hour})
			testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == len(others) },
				"the %d rows of other keys not all done (%d)", len(others), f.countDone())
			time.Sleep(300 * time.Millisecond)
			if got := f.countDone(); got != len(others) {
				t.Fatalf("%d rows done, want %d: the held key's rows went past its first", got, len(others))
			}
			for id := range others {
				if n, _ := a.count(idToMsg(t, f, id)); n != 1 {
					t.Fatalf("row %d of another key delivered %d times", id, n)
				}
			}
		})
	}
}

// A key whose backlog fills the claim's window — a bulk job's rows of one
// key, ahead of the rest — advances one row per batch round trip; the keys
// after it go meanwhile (found past the window by a skip scan of the keys),
// not once its backlog is down to a window's worth.
func TestHotKeyAheadOfTheWindowDoesNotHoldBackTheOthers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := newFake(TargetAMQP)
	const batch = 10 // window: keyWindow × 10 keyed rows
	hot := f.insertKeyed(1, 3*keyWindow*batch)
	others := f.insertKeyed(6, 1) // k0..k5: k0 is the hot key
	for id, k := range others {
		if k == "k0" {
			hot[id] = k
			delete(others, id)
		}
	}
	a.setFail(func(m *Message) error {
		if m.Key == "k0" {
			time.Sleep(10 * time.Millisecond) // a round trip of the hot key's
		}
		return nil
	})
	f.start(Config{Sinks: []Sink{a}, BatchSize: batch, Workers: 2})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(hot)+len(others) }, "not all rows done")
	order := a.confirmedOrder()
	hotBefore, left := 0, len(others)
	for _, id := range order {
		if left == 0 {
			break
		}
		if _, ok := others[id]; ok {
			left--
		} else {
			hotBefore++
		}
	}
	if hotBefore > keyWindow*batch {
		t.Fatalf("the other keys' %d rows went after %d of the hot key's %d: held back until its backlog fit the window (%d rows)",
			len(others), hotBefore, len(hot), keyWindow*batch)
	}
	checkKeyOrder(t, "hot key", order, hot)
	t.Logf("the other keys' rows done after %d of the hot key's %d", hotBefore, len(hot))
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
		SELECT 'orders.u', '\x00' FROM generate_series(1, $1)`, rows/2); err != nil {
		t.Fatal(err)
	}
	// Log every update and delete of a row.
	sch := `"` + f.table.Schema + `"`
	if _, err := f.pool.Exec(context.Background(), `
		CREATE TABLE `+sch+`.updates (id bigint NOT NULL, op text NOT NULL);
		CREATE FUNCTION `+sch+`.log_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO `+sch+`.updates VALUES (OLD.id, TG_OP); RETURN NULL; END $$;
		CREATE TRIGGER log_update AFTER UPDATE OR DELETE ON `+f.table.Ident()+` FOR EACH ROW EXECUTE FUNCTION `+sch+`.log_update();`); err != nil {
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

// A NOTIFY wakes one idle worker, not every one: the others' claims would
// come back empty, a transaction each per producer commit.
func TestNotifyWakesOneWorker(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var claims, empty atomic.Int64
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 4, PollInterval: time.Hour}, func(r *Relay) {
		r.hooks = &testHooks{claimed: func(rows int, _ int64) {
			claims.Add(1)
			if rows == 0 {
				empty.Add(1)
			}
		}}
	})

	// Each worker claims once at start, and one more after LISTEN is up.
	testenv.Eventually(t, 10*time.Second, func() bool { return claims.Load() >= 5 }, "relay did not start")
	time.Sleep(100 * time.Millisecond)
	before := empty.Load()

	const commits = 40
	for i := range commits {
		f.insert(1, "orders.created")
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == i+1 }, "row not delivered after its NOTIFY")
	}
	if got := empty.Load() - before; got > commits/4 {
		t.Errorf("%d empty claims for %d single-row commits with 4 idle workers: a NOTIFY woke more than one worker", got, commits)
	}
	t.Logf("%d claims, %d empty, for %d commits", claims.Load(), empty.Load()-before, commits)
}

// In a keyed backlog with few keys, every key's next row is in flight in
// some batch: a full batch must not wake idle workers into claims that find
// nothing (one wasted walk of the keyed window per batch). The worker that
// finishes a batch claims the keys it freed; the others wait for a NOTIFY.
func TestFullKeyedBatchesDoNotWakeWorkersWhoseClaimWasEmpty(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const keys, perKey = 5, 40
	keyOf := f.insertKeyed(keys, perKey)
	var claims, empty atomic.Int64
	f.startWith(Config{Sinks: []Sink{newFake(TargetAMQP), newFake(TargetNATS)}, Workers: 8, BatchSize: 2 * keys, PollInterval: time.Hour},
		func(r *Relay) {
			r.hooks = &testHooks{claimed: func(rows int, _ int64) {
				claims.Add(1)
				if rows == 0 {
					empty.Add(1)
				}
			}}
		})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(keyOf) }, "keyed backlog not delivered")
	// Every batch takes each key's next row: perKey full batches. At start
	// each of the 8 workers claims once, and one more claims when LISTEN is
	// up; those may come back empty.
	if got := empty.Load(); got > 8+1+perKey/4 {
		t.Errorf("%d empty claims of %d for %d full batches: full batches woke workers whose claim had found nothing", got, claims.Load(), perKey)
	}
	t.Logf("%d claims, %d empty", claims.Load(), empty.Load())
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
func (rt *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A batch costs two round trips to Postgres: begin and claim together, and
// record and commit together. At a few rows a batch, round trips are most
// of the relay's and Postgres's work.
func TestBatchTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	f := setup(t)
	st := newStore(f.table)
	rt := &roundTrips{match: func(sql string) bool {
		up := strings.ToUpper(sql)
		return strings.HasPrefix(up, "BEGIN") || up == "COMMIT" || up == "ROLLBACK" || sql == st.claimSQL || sql == st.recordSQL
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
		r.hooks = &testHooks{claimed: func(int, int64) { claims.Add(1) }}
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

// lateSink stands for a broker whose confirms outlive the publish timeout:
// every publish comes back "awaiting confirm", and the confirms come when
// the test says (confirmAll), through the LateConfirmer callback. After its
// first batch it reports itself down, so that its relay claims no more.
type lateSink struct {
	*fakeSink
	mu      sync.Mutex
	onLate  func(string)
	pending []string
	early   bool // confirm before Publish returns (before the batch records)
	// beforeEarly, when set, runs just before the early confirms.
	beforeEarly func()
}

func (s *lateSink) OnLateConfirm(f func(string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onLate = f
}

func (s *lateSink) Publish(_ context.Context, msgs []*Message, results []error) {
	s.mu.Lock()
	for i, m := range msgs {
		s.pending = append(s.pending, m.MessageID)
		results[i] = AwaitingConfirm(errors.New("test: no confirm yet"))
	}
	s.mu.Unlock()
	s.setDown(errors.New("test: stalled"))
	if s.early {
		if s.beforeEarly != nil {
			s.beforeEarly()
		}
		s.confirmAll()
	}
}

func (s *lateSink) confirmAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.pending {
		s.onLate(id)
	}
	s.pending = nil
}

// A confirm that comes after its batch gave up is recorded as a delivery at
// once, and the row is held back from a retry meanwhile: another instance
// never publishes it a second time. Dual write: the rows JetStream already
// has are done when RabbitMQ's late confirm is recorded. Early: the confirm
// comes before the batch that gave up has recorded its outcome.
func TestLateConfirmIsRecordedBeforeAnyRetry(t *testing.T) {
	t.Parallel()
	for _, early := range []bool{false, true} {
		t.Run(fmt.Sprintf("early=%v", early), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			stalled := &lateSink{fakeSink: newFake(TargetAMQP), early: early}
			f.start(Config{Sinks: []Sink{stalled, newFake(TargetNATS)}, Workers: 1, PublishTimeout: 2 * time.Second})
			ids := f.insert(50, "orders.created")
			// The stalled instance's batch is recorded: JetStream has the
			// rows, RabbitMQ's verdict is pending, and the retry waits at
			// least a publish timeout (early: or the rows are done
			// already).
			testenv.Eventually(t, 10*time.Second, func() bool {
				var held, done int
				f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.table.Ident()+`
					WHERE nats_delivered_at IS NOT NULL AND amqp_retry_at > now() + interval '1 second'`).Scan(&held)
				f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.table.Delivered()).Scan(&done)
				return held == len(ids) || early && held+done == len(ids)
			}, "the stalled batch was not recorded with its retry held back")
			other := newFake(TargetAMQP)
			otherNATS := newFake(TargetNATS)
			f.start(Config{Sinks: []Sink{other, otherNATS}, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
			if !early {
				time.Sleep(300 * time.Millisecond) // a retry without the hold-back is due by now
				stalled.confirmAll()
			}
			testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(ids) }, "late confirms not recorded")
			for _, id := range ids {
				if s := f.state(id); !s.amqpDelivered || !s.natsDelivered {
					t.Fatalf("row %s: %+v, want delivered to both", id, s)
				}
			}
			if n, m := other.total(), otherNATS.total(); n != 0 || m != 0 {
				t.Fatalf("the other instance published %d rows to RabbitMQ and %d to JetStream again, want none", n, m)
			}
		})
	}
}

// Late confirms that came while the relay was stopping are recorded before
// Run returns: the relay is told to stop, then the confirms come, during its
// last batch.
func TestLateConfirmsAtStopAreRecorded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	stalled := &lateSink{fakeSink: newFake(TargetAMQP), early: true}
	var cancel context.CancelFunc
	stalled.beforeEarly = func() {
		cancel()
		time.Sleep(100 * time.Millisecond) // the relay has seen it
	}
	_, cancel, done := f.start(Config{Sinks: []Sink{stalled}, Workers: 1})
	ids := f.insert(20, "orders.created") // after cancel is set: no batch before
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if n := f.countDone(); n != len(ids) {
		t.Fatalf("%d of %d rows recorded delivered when Run returned", n, len(ids))
	}
}

// A burst of a few keys' rows drains at batch speed, with no NOTIFY or poll
// after the first claim: a worker whose batch held keys claims again, for
// their next rows. It waited for the next NOTIFY or PollInterval (an hour
// here): one row per key per poll.
func TestKeyedBurstDrainsWithoutPolls(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: time.Hour}, nil)
	keyOf := f.insertKeyed(3, 20)
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(keyOf) }, "keyed burst not drained")
	checkKeyOrder(t, "amqp", a.confirmedOrder(), keyOf)
	checkKeyOrder(t, "nats", n.confirmedOrder(), keyOf)
}

// The LISTEN connection dropped again and again over a process's life
// (failovers, idle-session timeouts): each time it had listened, the next
// reconnection comes at once. The backoff used to double across drops and
// never reset: after seven, every reconnection waited 5–10 s, and the
// NOTIFYs of that time were lost.
func TestListenReconnectsAtOnceAfterEachDrop(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.start(Config{Sinks: []Sink{newFake(TargetAMQP)}, PollInterval: time.Hour})
	ctx := context.Background()
	listening := func() int { return wakeLockHolder(t, f.pool, f.table) } // idle: the listener holds it
	for i := range 9 {
		var pid int
		start := time.Now()
		testenv.Eventually(t, 30*time.Second, func() bool { pid = listening(); return pid != 0 }, "no LISTEN connection (drop %d)", i)
		if took := time.Since(start); i > 0 && took > 2*time.Second {
			t.Fatalf("LISTEN back %v after drop %d, want at once (the backoff restarts after a connection that listened)", took, i)
		}
		if _, err := f.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return listening() != pid }, "LISTEN connection %d not gone", pid)
	}
	// And a NOTIFY is heard on the last one.
	testenv.Eventually(t, 30*time.Second, func() bool { return listening() != 0 }, "no LISTEN connection at the end")
	f.insert(1, "orders.created")
	testenv.Eventually(t, 5*time.Second, func() bool { return f.countDone() == 1 }, "row not delivered after its NOTIFY (poll interval 1h)")
}

// The insert trigger's channel follows the spelling of the table's name
// migrate was given: a table migrated as "name" (on the search_path) and
// relayed as "schema.name" is one table with two channel names. The relay
// listens on the trigger's, so its NOTIFYs are heard (they went unheard, the
// rows waiting for the poll interval).
func TestNotifyHeardWhateverTheSpellingOfTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	sch, name := testenv.Name("t"), testenv.Name("o")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{sch}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{sch}.Sanitize()+` CASCADE`) }) //nolint:errcheck // best effort
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = sch
	onPath, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(onPath)
	_, err = schema.Up(ctx, db, schema.Table{Name: name}, nil)
	db.Close()
	onPath.Close()
	if err != nil {
		t.Fatal(err)
	}

	f := &fixture{t: t, pool: pool, table: schema.Table{Schema: sch, Name: name}}
	f.start(Config{Sinks: []Sink{newFake(TargetAMQP)}, PollInterval: time.Hour})
	testenv.Eventually(t, 30*time.Second, func() bool { return wakeLockHolder(t, pool, f.table) != 0 }, "no idle LISTEN connection")
	f.insert(1, "orders.created")
	testenv.Eventually(t, 5*time.Second, func() bool { return f.countDone() == 1 }, "row not delivered after its NOTIFY (poll interval 1h)")
}

// A batch that failed for want of the broker pauses the target and makes it
// unready; when no row comes after it, nothing can close the breaker, and
// the target used to stay unready (/readyz 503) until the next row. It is
// ready again once its pause ended and a batch's time passed with no new
// failure.
func TestPauseWithoutLaterRowsEndsUnready(t *testing.T) {
	t.Parallel()
	f := setup(t)
	n := newFake(TargetNATS)
	var failed atomic.Bool
	n.setFail(func(*Message) error {
		if failed.CompareAndSwap(false, true) {
			return Unavailable(errors.New("nats: timeout"))
		}
		return nil
	})
	id := f.insert(1, "orders.created")[0]
	r, _, _ := f.start(Config{Sinks: []Sink{n}, PublishTimeout: 500 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		RetryMin: time.Hour, RetryMax: time.Hour})
	testenv.Eventually(t, 10*time.Second, func() bool { return len(r.Unready()) > 0 }, "target not paused by the failed batch")
	// The row waits an hour (RetryMin): no batch closes the breaker.
	testenv.Eventually(t, 10*time.Second, func() bool { return len(r.Unready()) == 0 }, "target still unready with no batch since its pause")
	if got, tries := n.count(id); got != 0 || tries != 1 {
		t.Fatalf("row published %d times (%d confirmed), want once, failed: no batch after the pause", tries, got)
	}
}
