package relay

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

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

// setupOwnDatabase is setup in a database of the test's own: for a test that
// holds a transaction or a snapshot open for seconds, which in the shared
// one would hold back every other test's CREATE INDEX CONCURRENTLY (it
// waits for the database's older snapshots) and VACUUM.
func setupOwnDatabase(t *testing.T) *fixture {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &fixture{t: t, pool: pool, table: testenv.Outbox(t, pool)}
}

// fill bulk-inserts n small unkeyed rows.
func (f *fixture) fill(n int) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.table.Ident()+`
		(topic, payload) SELECT 'orders.created', '\x00' FROM generate_series(1, @rows)`, pgx.NamedArgs{"rows": n}); err != nil {
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
		 SELECT @topic, convert_to('p' || g, 'UTF8'), '{"traceparent":"00-1-2-01"}' FROM generate_series(1, @rows) g
		 RETURNING message_id::text`, pgx.NamedArgs{"topic": topic, "rows": n})
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

// setRow sets one row's delivery state: set is the SET list, a test's own.
func (f *fixture) setRow(id, set string) {
	f.t.Helper()
	testenv.SetState(f.t, f.pool, f.table, set, "message_id = @message_id", pgx.NamedArgs{"message_id": id})
}

// state reads one row's delivery columns.
type rowState struct {
	amqpDelivered, natsDelivered, done bool
	amqpParked, natsParked             bool
	amqpAttempts, natsAttempts         int
	amqpErr, natsErr                   string
}

// state is a row's delivery state: from the owed table while a target
// still owes it after a batch, none while it is in the outbox, else from the
// delivered table (done; attempts and errors are not kept there).
func (f *fixture) state(id string) rowState {
	f.t.Helper()
	var s rowState
	var ae, ne *string
	err := f.pool.QueryRow(context.Background(), `SELECT amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL, done_at IS NOT NULL,
		amqp_parked_at IS NOT NULL, nats_parked_at IS NOT NULL, amqp_attempts, nats_attempts, amqp_last_error, nats_last_error
		FROM `+f.table.Owed()+` WHERE message_id = @message_id
		UNION ALL SELECT false, false, false, false, false, 0, 0, NULL, NULL FROM `+f.table.Ident()+` WHERE message_id = @message_id`, pgx.NamedArgs{"message_id": id}).
		Scan(&s.amqpDelivered, &s.natsDelivered, &s.done, &s.amqpParked, &s.natsParked, &s.amqpAttempts, &s.natsAttempts, &ae, &ne)
	if errors.Is(err, pgx.ErrNoRows) {
		s.done = true
		err = f.pool.QueryRow(context.Background(), `SELECT amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL
			FROM `+f.table.Delivered()+` WHERE message_id = @message_id`, pgx.NamedArgs{"message_id": id}).Scan(&s.amqpDelivered, &s.natsDelivered)
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
// delivered table, and gone from the outbox and the owed table. It fails the
// test if a row is in the record and in either.
func (f *fixture) countDone() int {
	f.t.Helper()
	var n, both int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*), count(o.id) + count(w.id) FROM `+f.table.Delivered()+` d
		LEFT JOIN `+f.table.Ident()+` o ON o.id = d.id LEFT JOIN `+f.table.Owed()+` w ON w.id = d.id`).Scan(&n, &both); err != nil {
		f.t.Fatal(err)
	}
	if both != 0 {
		f.t.Fatalf("%d rows recorded delivered are still in the outbox", both)
	}
	return n
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

func idToMsg(t *testing.T, f *fixture, id int64) string {
	t.Helper()
	var m string
	if err := f.pool.QueryRow(context.Background(), `SELECT message_id::text FROM `+f.table.Ident()+` WHERE id = @id
		UNION ALL SELECT message_id::text FROM `+f.table.Owed()+` WHERE id = @id
		UNION ALL SELECT message_id::text FROM `+f.table.Delivered()+` WHERE id = @id`, pgx.NamedArgs{"id": id}).Scan(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// planBlocks runs query with args under EXPLAIN (ANALYZE, BUFFERS) in tx
// and returns the shared blocks it read, from cache or not.
func planBlocks(t *testing.T, tx pgx.Tx, query string, args ...any) float64 {
	t.Helper()
	var plan []map[string]any
	if err := tx.QueryRow(context.Background(), `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+query, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	p := plan[0]["Plan"].(map[string]any)
	return p["Shared Hit Blocks"].(float64) + p["Shared Read Blocks"].(float64)
}

// claimWith runs the claim cf began at fl as a worker's would, in a
// transaction it rolls back, and moves cf's floors as after a claim that
// took the rows it returns.
func claimWith(t *testing.T, pool *pgxpool.Pool, st *store, cf *claimFloor, fl floors, enabled, active phase, limit int) []*claimed {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		cf.end(fl, false)
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Exec(ctx, `ROLLBACK`) //nolint:errcheck // the floors only
	rows, snap, err := st.claim(ctx, conn, enabled, active, limit, false, fl, nil)
	if err != nil {
		cf.end(fl, false)
		t.Fatal(err)
	}
	cf.claimed(rows, fl, snap, time.Millisecond)
	cf.end(fl, true)
	return rows
}
