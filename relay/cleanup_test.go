package relay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
)

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

// The sweep finishes one slice of stranded rows a cleanup, in id order,
// from the start again once it reached the end: a stranded row left later
// below where it stands (here by an instance still in dual write) is found
// within a round, and no cleanup moves a whole backlog in one statement.
func TestStrandedRowSweepGoesASliceAtATime(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.insert(35, "orders.created")
	// Pending for JetStream but not due: the relay leaves them be.
	testenv.SetState(t, f.pool, f.table, `nats_retry_at = now() + interval '1 hour'`, "true")
	for _, id := range ids[10:] {
		f.setRow(id, "nats_delivered_at = now(), nats_retry_at = NULL, amqp_retry_at = now() + interval '1 hour'")
	}
	r, _, _ := f.startWith(Config{Sinks: []Sink{newFake(TargetNATS)}, CleanupInterval: time.Hour}, func(r *Relay) { r.stranded.slice = 10 })
	finished := func() (done []int) {
		for i, id := range ids {
			if f.state(id).done {
				done = append(done, i)
			}
		}
		return done
	}
	upTo := func(from, to int) []int {
		var want []int
		for i := from; i < to; i++ {
			want = append(want, i)
		}
		return want
	}
	cleanup := func() {
		t.Helper()
		if err := r.CleanupOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// 25 stranded rows in slices of 10, the rows owed to JetStream left be.
	for _, to := range []int{20, 30, 35} {
		cleanup()
		if got, want := finished(), upTo(10, to); !slices.Equal(got, want) {
			t.Fatalf("rows finished %v, want %v", got, want)
		}
	}
	// Another instance, still in dual write, leaves the first row
	// delivered to JetStream, owed to RabbitMQ: the next round has it.
	f.setRow(ids[0], "nats_delivered_at = now(), nats_retry_at = NULL, amqp_retry_at = now() + interval '1 hour'")
	cleanup()
	if got, want := finished(), append([]int{0}, upTo(10, 35)...); !slices.Equal(got, want) {
		t.Fatalf("rows finished %v, want %v", got, want)
	}
}

// The sweep reads only the stranded rows, through their own index: not the
// owed table's other rows, nor the dead ones a held horizon keeps there. Here
// a snapshot is held while the 20,000 rows of a JetStream outage in phase
// nats leave the owed table; the sweep's statement, read with EXPLAIN
// (ANALYZE, BUFFERS) in a transaction rolled back, against a walk of the
// owed table's primary key over the same ids.
func TestStrandedRowSweepPassesWhatAHorizonKeepsDead(t *testing.T) {
	t.Parallel()
	f := setupOwnDatabase(t)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `ALTER TABLE `+f.table.Owed()+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	f.fill(20_000)
	testenv.SetState(t, f.pool, f.table, `nats_retry_at = now()`, "true")
	stranded := f.insert(3, "orders.created")
	for _, id := range stranded {
		f.setRow(id, "nats_delivered_at = now(), amqp_retry_at = now() + interval '1 hour'")
	}
	holder, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // only a snapshot
	if _, err := holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; SELECT 1 FROM `+f.table.Owed()+` LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	// JetStream is back: the outage's rows leave (to the delivered table,
	// which this test does not need), dead to the snapshot's horizon.
	if _, err := f.pool.Exec(ctx, `DELETE FROM `+f.table.Owed()+` WHERE nats_delivered_at IS NULL; ANALYZE `+f.table.Owed()); err != nil {
		t.Fatal(err)
	}
	r, _, _ := f.start(Config{Sinks: []Sink{newFake(TargetNATS)}, CleanupInterval: time.Hour})
	blocks := func(query string, args ...any) float64 {
		t.Helper()
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // finishes nothing worth keeping
		// Planned as in finishStranded's transaction.
		if _, err := tx.Exec(ctx, outboxsql.OnIndexes); err != nil {
			t.Fatal(err)
		}
		return planBlocks(t, tx, query, args...)
	}
	sweep := blocks(r.store.sql.Finish, pgx.StrictStructArgs(outboxsql.FinishParams{After: 0, Limit: strandedSliceRows}))
	walk := blocks(`SELECT count(*) FROM (SELECT id FROM ` + f.table.Owed() + ` WHERE id > 0 ORDER BY id LIMIT 50000) s`)
	var pages float64
	if err := f.pool.QueryRow(ctx, `SELECT pg_relation_size(@owed::regclass) / current_setting('block_size')::int`,
		pgx.NamedArgs{"owed": f.table.Owed()}).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	t.Logf("the sweep reads %v blocks; a walk of the owed table's primary key %v, its heap %v pages", sweep, walk, pages)
	if walk < pages {
		t.Fatalf("the walk of the primary key read %v blocks, fewer than the heap's %v pages: the test does not reproduce the horizon", walk, pages)
	}
	if sweep*10 > pages {
		t.Errorf("the sweep reads %v blocks, the owed table's heap has %v pages: want a few, the stranded rows' index only", sweep, pages)
	}
	if err := r.CleanupOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range stranded {
		if s := f.state(id); !s.done || !s.natsDelivered {
			t.Errorf("stranded row %s: %+v, want finished", id, s)
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

// A relay still in nats only, by its RELAY_TARGETS or before it read the
// change, finishes no stranded row once the table's phase is set to
// another: the relays in dual write still send those rows to RabbitMQ.
func TestStrandedRowsStayOnceTheTableLeavesNATS(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.insert(1, "orders.created")
	f.setRow(ids[0], "nats_delivered_at = now(), amqp_retry_at = now() + interval '1 hour'")
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.table.Side("phase")+` (phase, changed_by) VALUES ('dual', 'test')`); err != nil {
		t.Fatal(err)
	}
	r, _, _ := f.start(Config{Sinks: []Sink{newFake(TargetNATS)}, CleanupInterval: time.Hour})
	if err := r.CleanupOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := f.state(ids[0]); s.done || !s.natsDelivered {
		t.Fatalf("row %+v, want still in the outbox, owed to RabbitMQ", s)
	}
}

// The record of delivered ids older than Retention is deleted; the rest of
// it, and the outbox, stay.
func TestCleanupKeepsRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := newFake(TargetAMQP)
	r, err := New(f.pool, Config{Table: f.table, Sinks: []Sink{a}, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.insert(100, "orders.created")
	ctx := context.Background()
	// 2300 ids recorded two hours ago, 200 a minute ago: more than one
	// statement's 1000.
	if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.table.Delivered()+` (id, message_id, amqp_delivered_at, done_at)
		SELECT -g, gen_random_uuid(), now(), now() - CASE WHEN g <= 2300 THEN interval '2 hours' ELSE interval '1 minute' END
		FROM generate_series(1, 2500) g`); err != nil {
		t.Fatal(err)
	}
	if err := r.CleanupOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var left, leftDelivered int
	if err := f.pool.QueryRow(ctx, `SELECT count(*), (SELECT count(*) FROM `+f.table.Delivered()+`) FROM `+f.table.Ident()).
		Scan(&left, &leftDelivered); err != nil {
		t.Fatal(err)
	}
	if left != 100 || leftDelivered != 200 {
		t.Fatalf("after cleanup: %d rows and %d delivered ids, want 100 and 200", left, leftDelivered)
	}
}

// The retention cleanup starts where its last pass stopped (less
// trimMargin): while a snapshot holds VACUUM's horizon, the delivered
// record's deleted rows stay in its primary key, and a pass from the
// oldest would walk all of them again. Read with EXPLAIN (ANALYZE,
// BUFFERS) of the next pass, from where the relay stopped and from the
// oldest, in a transaction rolled back.
func TestRetentionCleanupStartsWhereItStopped(t *testing.T) {
	t.Parallel()
	f := setupOwnDatabase(t)
	ctx := context.Background()
	f.noAutovacuum()
	// 5,000 rows past retention, a second apart, three days ago.
	if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.table.Delivered()+` (id, message_id, done_at, amqp_delivered_at, nats_delivered_at, amqp_sent)
		SELECT g, gen_random_uuid(), now() - interval '3 days' - g * interval '1 second', now(), now(), true FROM generate_series(1, 5000) g;
		ANALYZE `+f.table.Delivered()); err != nil {
		t.Fatal(err)
	}
	holder, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // only a snapshot
	if _, err := holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM `+f.table.Delivered()+` LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	r, _, _ := f.start(Config{Sinks: []Sink{newFake(TargetNATS)}, CleanupInterval: time.Hour})
	if err := r.CleanupOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if r.trimmed[0].IsZero() {
		t.Fatal("the cleanup did not note where it stopped")
	}
	buffers := func(from time.Time) float64 {
		t.Helper()
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // deletes nothing worth keeping
		p := outboxsql.CleanupParams{RetentionMS: r.cfg.Retention.Milliseconds(), Limit: 1000, From: from}
		return planBlocks(t, tx, r.store.sql.CleanupDelivered, pgx.StrictStructArgs(p))
	}
	fromStop, fromOldest := buffers(r.trimmed[0].Add(-trimMargin)), buffers(time.Time{})
	t.Logf("the next pass reads %v blocks from where the last stopped, %v from the oldest", fromStop, fromOldest)
	if fromStop*4 > fromOldest {
		t.Errorf("the next pass reads %v blocks from where the last stopped, %v from the oldest: want a fraction", fromStop, fromOldest)
	}
}
