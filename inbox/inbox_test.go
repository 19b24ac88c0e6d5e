package inbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

var errBoom = errors.New("boom")

// The same id twice: the handler runs once; the second Process reports
// processed=false. Ids that differ only in a UUID's case are the same id;
// another consumer group processes the id on its own.
func TestProcessOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	reg := prometheus.NewRegistry()
	in := f.newInbox(inbox.Config{Registerer: reg})
	ctx := context.Background()
	var calls atomic.Int64
	h := f.effect("a", &calls)
	id := uuids(1)[0]

	for i, m := range []inbox.Message{
		{ID: id, Source: inbox.SourceNATS, Subject: "orders.created", Payload: []byte("{}")},
		{ID: id, Source: inbox.SourceAMQP, Subject: "orders.created", Payload: []byte("{}")},
		{ID: strings.ToUpper(id), Source: inbox.SourceAMQP},
	} {
		processed, err := in.Process(ctx, m, h)
		if err != nil {
			t.Fatalf("Process #%d: %v", i+1, err)
		}
		if want := i == 0; processed != want {
			t.Fatalf("Process #%d (id %s) = %v, want %v", i+1, m.ID, processed, want)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("handler called %d times, want 1", calls.Load())
	}
	f.checkOnce([]string{id})

	// Not a UUID: compared exactly, case included.
	for _, other := range []string{"order-17", "ORDER-17"} {
		if processed, err := in.Process(ctx, inbox.Message{ID: other, Source: inbox.SourceNATS}, h); err != nil || !processed {
			t.Fatalf("Process(%q) = %v, %v; want true, nil", other, processed, err)
		}
	}

	// Another consumer group sharing the table processes it once too.
	other := f.newInbox(inbox.Config{Consumer: "billing", Registerer: reg})
	for i := range 2 {
		processed, err := other.Process(ctx, inbox.Message{ID: id, Source: inbox.SourceNATS}, h)
		if err != nil || processed != (i == 0) {
			t.Fatalf("consumer billing, Process #%d = %v, %v; want %v, nil", i+1, processed, err, i == 0)
		}
	}
	if n := f.inboxRows(inbox.DefaultConsumer); n != 3 {
		t.Errorf("inbox rows for consumer default: %d, want 3", n)
	}

	for _, c := range []struct {
		name, source string
		want         float64
	}{
		{"relayd_inbox_processed_total", "nats", 4},
		{"relayd_inbox_processed_total", "amqp", 0},
		{"relayd_inbox_duplicates_total", "amqp", 2},
		{"relayd_inbox_duplicates_total", "nats", 1},
		{"relayd_inbox_errors_total", "amqp", 0},
	} {
		if got := counter(t, reg, c.name, c.source); got != c.want {
			t.Errorf("%s{source=%q} = %v, want %v", c.name, c.source, got, c.want)
		}
	}
}

// A failing handler leaves nothing behind — neither its own writes nor the
// id — and the redelivery is processed (once).
func TestHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	f := setup(t)
	reg := prometheus.NewRegistry()
	in := f.newInbox(inbox.Config{Registerer: reg})
	ctx := context.Background()
	var calls atomic.Int64
	ok := f.effect("a", &calls)
	failing := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := ok(ctx, tx, m); err != nil {
			return err
		}
		return errBoom // after the side effect was written
	}
	m := inbox.Message{ID: "order-42", Source: inbox.SourceAMQP}

	processed, err := in.Process(ctx, m, failing)
	if !errors.Is(err, errBoom) || processed {
		t.Fatalf("Process with a failing handler = %v, %v; want false and an error wrapping errBoom", processed, err)
	}
	if n := len(f.sideCounts()); n != 0 {
		t.Fatalf("after the handler failed: %d side effects committed, want 0", n)
	}
	if n := f.inboxRows(inbox.DefaultConsumer); n != 0 {
		t.Fatalf("after the handler failed: %d ids recorded, want 0", n)
	}
	for i := range 2 {
		processed, err := in.Process(ctx, m, ok)
		if err != nil || processed != (i == 0) {
			t.Fatalf("redelivery #%d: Process = %v, %v; want %v, nil", i+1, processed, err, i == 0)
		}
	}
	f.checkOnce([]string{"order-42"})
	if calls.Load() != 2 {
		t.Errorf("handler called %d times, want 2 (failed once, then processed)", calls.Load())
	}
	if got := counter(t, reg, "relayd_inbox_errors_total", "amqp"); got != 1 {
		t.Errorf("errors_total{amqp} = %v, want 1", got)
	}
}

// A delivery of an id whose first delivery is still being processed waits
// for that transaction (Postgres: INSERT ... ON CONFLICT DO NOTHING blocks on
// a conflicting uncommitted insert), then sees the id recorded if it
// committed, or processes the message if it rolled back.
func TestConcurrentDuplicateWaits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		firstErr  error
		wantOther bool // the waiting delivery processes the message
	}{
		{"first commits", nil, false},
		{"first rolls back", errBoom, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			// The waiting instance has its own pool, tagged so its session
			// can be found in pg_stat_activity.
			app := testenv.Name("inbox_waiter")
			pc, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
			if err != nil {
				t.Fatal(err)
			}
			pc.ConnConfig.RuntimeParams["application_name"] = app
			pool2, err := pgxpool.NewWithConfig(context.Background(), pc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool2.Close)
			first := f.newInbox(inbox.Config{})
			second, err := inbox.New(pool2, inbox.Config{Table: f.table})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			m := inbox.Message{ID: uuids(1)[0], Source: inbox.SourceNATS}

			var firstCalls, secondCalls atomic.Int64
			entered, release := make(chan struct{}), make(chan error)
			type result struct {
				processed bool
				err       error
			}
			firstDone, secondDone := make(chan result, 1), make(chan result, 1)
			go func() {
				h := f.effect("first", &firstCalls)
				p, err := first.Process(ctx, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
					if err := h(ctx, tx, m); err != nil {
						return err
					}
					close(entered)
					return <-release
				})
				firstDone <- result{p, err}
			}()
			<-entered
			go func() {
				p, err := second.Process(ctx, m, f.effect("second", &secondCalls))
				secondDone <- result{p, err}
			}()

			testenv.Eventually(t, 10*time.Second, func() bool {
				var waiting int
				if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%'`, app).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				return waiting == 1
			}, "the second delivery's INSERT is not waiting on a lock")
			select {
			case r := <-secondDone:
				t.Fatalf("second delivery returned %v, %v while the first was uncommitted", r.processed, r.err)
			default:
			}

			release <- tc.firstErr
			r1, r2 := <-firstDone, <-secondDone
			if r1.processed != (tc.firstErr == nil) || !errors.Is(r1.err, tc.firstErr) {
				t.Fatalf("first delivery: %v, %v", r1.processed, r1.err)
			}
			if r2.err != nil || r2.processed != tc.wantOther {
				t.Fatalf("second delivery = %v, %v; want %v, nil", r2.processed, r2.err, tc.wantOther)
			}
			if got := secondCalls.Load(); got != map[bool]int64{false: 0, true: 1}[tc.wantOther] {
				t.Fatalf("second handler called %d times", got)
			}
			f.checkOnce([]string{m.ID})
		})
	}
}

// 8 consumers process the same 200 ids at once (in the same order, and in
// reverse, to collide as much as possible): every side effect happens
// exactly once and exactly 200 calls report processed.
func TestConcurrentProcessing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pc, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	in, err := inbox.New(pool, inbox.Config{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	ids := uuids(200)
	var processed, calls atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := slices.Clone(ids)
			if g%2 == 1 {
				slices.Reverse(order)
			}
			source := []string{inbox.SourceAMQP, inbox.SourceNATS}[g%2]
			h := f.effect("g", &calls)
			for _, id := range order {
				p, err := in.Process(context.Background(), inbox.Message{ID: id, Source: source}, h)
				if err != nil {
					t.Errorf("Process(%s): %v", id, err)
					return
				}
				if p {
					processed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if processed.Load() != 200 || calls.Load() != 200 {
		t.Errorf("processed=true %d times, handler called %d times; want 200 and 200", processed.Load(), calls.Load())
	}
	f.checkOnce(ids)
}

// Cleanup deletes this consumer's ids older than Retention, in batches,
// and nothing else; a deleted id is processed again.
func TestCleanup(t *testing.T) {
	t.Parallel()
	f := setup(t)
	in := f.newInbox(inbox.Config{Consumer: "c", Retention: 24 * time.Hour})
	ins := func(consumer string, n int, age string) {
		f.exec(`INSERT INTO `+f.table+` (consumer, message_id, source, received_at)
			SELECT $1, $1 || '-' || $3 || '-' || g, 'nats', now() - $2::interval FROM generate_series(1, $4) g`,
			consumer, age, strings.ReplaceAll(age, " ", ""), n)
	}
	ins("c", 2100, "25 hours") // past retention: 3 batches
	ins("c", 300, "23 hours")  // within
	ins("other", 50, "30 days")
	deleted, err := in.Cleanup(context.Background())
	if err != nil || deleted != 2100 {
		t.Fatalf("Cleanup = %d, %v; want 2100, nil", deleted, err)
	}
	if c, o := f.inboxRows("c"), f.inboxRows("other"); c != 300 || o != 50 {
		t.Fatalf("after cleanup: %d rows of c (want 300), %d of other (want 50)", c, o)
	}
	var calls atomic.Int64
	if p, err := in.Process(context.Background(), inbox.Message{ID: "c-25hours-1", Source: inbox.SourceNATS}, f.effect("a", &calls)); err != nil || !p {
		t.Fatalf("Process of an id past retention = %v, %v; want processed again", p, err)
	}
	if p, err := in.Process(context.Background(), inbox.Message{ID: "c-23hours-1", Source: inbox.SourceNATS}, f.effect("a", &calls)); err != nil || p {
		t.Fatalf("Process of an id within retention = %v, %v; want a duplicate", p, err)
	}

	// RunCleanup does the same on its own and stops with its context.
	ins("c", 10, "2 days")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { in.RunCleanup(ctx, 10*time.Millisecond); close(done) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return f.inboxRows("c") == 301 }, "RunCleanup did not delete old rows")
	cancel()
	<-done
}

// Migrate is safe from several processes at once, idempotent, and records
// its version in <table>_schema_version next to the table.
func TestMigrate(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := testenv.Name("inbox")
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+s+`" CASCADE`) })
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			errs[i] = inbox.Migrate(ctx, db, s+".inbox")
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Migrate #%d: %v", i, err)
		}
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := inbox.Migrate(ctx, db, s+".inbox"); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	p, err := inbox.NewProvider(db, s+".inbox", nil)
	if err != nil {
		t.Fatal(err)
	}
	if pending, err := p.HasPending(ctx); err != nil || pending {
		t.Fatalf("HasPending = %v, %v; want false", pending, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+s+`".inbox_schema_version WHERE version_id > 0`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("version rows in %s.inbox_schema_version: %d, %v; want 1", s, n, err)
	}
	// The table's contract.
	for _, q := range []string{
		`INSERT INTO "` + s + `".inbox (consumer, message_id, source) VALUES ('c', '', 'nats')`,
		`INSERT INTO "` + s + `".inbox (consumer, message_id, source) VALUES ('c', 'x', 'kafka')`,
	} {
		if _, err := pool.Exec(ctx, q); err == nil {
			t.Errorf("%s: accepted, want a constraint error", q)
		}
	}

	if err := inbox.Migrate(ctx, db, "Bad.Name"); !errors.Is(err, schema.ErrInvalidTable) {
		t.Errorf("Migrate(Bad.Name) = %v, want ErrInvalidTable", err)
	}
}

// Process on a table nobody migrated says what to do.
func TestUnmigratedTable(t *testing.T) {
	t.Parallel()
	in, err := inbox.New(testenv.Pool(t), inbox.Config{Table: testenv.Name("nosuch") + ".inbox"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = in.Process(context.Background(), inbox.Message{ID: "x", Source: inbox.SourceNATS},
		func(context.Context, pgx.Tx, inbox.Message) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "inbox.Migrate") {
		t.Fatalf("Process on a missing table: %v; want an error naming inbox.Migrate", err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/x") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, tc := range []struct {
		cfg  inbox.Config
		want string // "" means valid
	}{
		{inbox.Config{}, ""},
		{inbox.Config{Table: "app.inbox", Consumer: "billing", Retention: time.Hour}, ""},
		{inbox.Config{Table: "Inbox"}, "Table"},
		{inbox.Config{Table: "a.b.c"}, "Table"},
		{inbox.Config{Consumer: strings.Repeat("c", 201)}, "Consumer"},
		{inbox.Config{Consumer: "a\x00b"}, "Consumer"},
		{inbox.Config{Retention: -time.Hour}, "Retention"},
		{inbox.Config{RetryMin: -time.Second}, "RetryMin"},
		{inbox.Config{RetryMin: time.Minute, RetryMax: time.Second}, "RetryMax"},
	} {
		_, err := inbox.New(pool, tc.cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("New(%+v): %v, want valid", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := inbox.New(nil, inbox.Config{}); err == nil {
		t.Error("New(nil pool) succeeded")
	}
	// Two Inboxes on one Registerer share the counters.
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := inbox.New(pool, inbox.Config{Registerer: reg}); err != nil {
			t.Fatalf("second Inbox on one Registerer: %v", err)
		}
	}
}

// Bad input to Process fails before touching the database.
func TestProcessRejectsBadInput(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/x") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	in, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, pgx.Tx, inbox.Message) error { t.Error("handler called"); return nil }
	for _, tc := range []struct {
		m    inbox.Message
		want error
	}{
		{inbox.Message{Source: inbox.SourceAMQP}, inbox.ErrNoMessageID},
		{inbox.Message{ID: strings.Repeat("x", inbox.MaxIDLength+1), Source: inbox.SourceAMQP}, inbox.ErrInvalidMessageID},
		{inbox.Message{ID: "a\x00b", Source: inbox.SourceNATS}, inbox.ErrInvalidMessageID},
		{inbox.Message{ID: "\xff", Source: inbox.SourceNATS}, inbox.ErrInvalidMessageID},
	} {
		if _, err := in.Process(context.Background(), tc.m, h); !errors.Is(err, tc.want) {
			t.Errorf("Process(%q) = %v, want %v", tc.m.ID, err, tc.want)
		}
	}
	if _, err := in.Process(context.Background(), inbox.Message{ID: "x", Source: "kafka"}, h); err == nil {
		t.Error("Process with source kafka succeeded")
	}
}
