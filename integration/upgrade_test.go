package integration

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
	"github.com/relayd/relayd/schema"
)

// upgradeFrom is the last migration before the done rows moved out.
const upgradeFrom = 9

// An outbox at migration 9 holding rows finished before 00005, rows owed to
// each target and a parked row is migrated while a relay relays it and
// producers write: each target gets exactly what it was owed, the parked row
// stays parked (in the owed table since 00013), the finished rows are in the
// delivered table, their index and the CHECKs are gone, and the outbox has
// only the producers' columns and indexes.
func TestUpgradeWhileRelaying(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(e.pool)
	defer db.Close()
	p, err := schema.NewProvider(db, e.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Down to 9 runs the later migrations' downs: the done index and the
	// CHECKs are back.
	if _, err := p.DownTo(ctx, upgradeFrom); err != nil {
		t.Fatalf("migrate down to %d: %v", upgradeFrom, err)
	}
	tbl := e.table.Ident()
	checks := func() int { return testenv.Checks(t, e.pool, e.table) }
	if !e.hasIndex("outbox_done") || checks() != 2 {
		t.Fatalf("at migration 9 the outbox has no done index, or %d CHECKs, not 2", checks())
	}
	run := func(q string, args ...any) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// What relayd before 00005 left: finished rows, marked done in place.
	run(`INSERT INTO ` + tbl + ` (topic, payload, amqp_delivered_at, amqp_attempts, nats_delivered_at, nats_attempts, done_at)
		SELECT 'test.done', '\x00', now() - interval '2 hours', 1, now() - interval '2 hours', 1, now() - interval '1 hour'
		FROM generate_series(1, 50)`)
	// Rows owed to one target, the other's delivery recorded.
	run(`INSERT INTO ` + tbl + ` (topic, payload, nats_delivered_at, nats_attempts) SELECT 'test.amqp', '\x01', now(), 1 FROM generate_series(1, 20)`)
	run(`INSERT INTO ` + tbl + ` (topic, payload, amqp_delivered_at, amqp_attempts) SELECT 'test.nats', '\x02', now(), 1 FROM generate_series(1, 20)`)
	run(`INSERT INTO ` + tbl + ` (topic, payload) SELECT 'test.both', '\x03' FROM generate_series(1, 20)`)
	// Parked for RabbitMQ, delivered to JetStream.
	run(`INSERT INTO ` + tbl + ` (topic, payload, amqp_attempts, amqp_parked_at, amqp_last_error, nats_delivered_at, nats_attempts)
		VALUES ('test.parked', '\x04', 5, now(), 'poison', now(), 1)`)
	owed := func(owedTo string) map[string]bool {
		ids := map[string]bool{}
		rows, err := e.pool.Query(ctx, `SELECT message_id::text FROM `+tbl+` WHERE done_at IS NULL AND `+owedTo+`_delivered_at IS NULL AND `+owedTo+`_parked_at IS NULL`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids[id] = true
		}
		return ids
	}
	wantAMQP, wantNATS := owed("amqp"), owed("nats")
	var done int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl+` WHERE done_at IS NOT NULL`).Scan(&done); err != nil || done != 50 {
		t.Fatalf("done rows: %d, %v", done, err)
	}

	// A relayd of this build refuses a table with migrations pending: the
	// later ones are marked applied while it starts, as for a relayd of the
	// release before them. Its statements name the owed table: it claims
	// nothing until 00013 has run, then relays all that was owed.
	versions := e.table.Side("schema_version")
	sources := p.ListSources()
	run(`INSERT INTO `+versions+` (version_id, is_applied) SELECT v, true FROM generate_series($1::bigint, $2::bigint) v`,
		upgradeFrom+1, sources[len(sources)-1].Version)
	relay := e.startRelay("relay")
	run(fmt.Sprintf(`DELETE FROM %s WHERE version_id > %d`, versions, upgradeFrom))

	// Producers write throughout the migration.
	stop := make(chan struct{})
	stopProducers := sync.OnceFunc(func() { close(stop) })
	var wg sync.WaitGroup
	t.Cleanup(func() { stopProducers(); wg.Wait() }) // a failing check ends the test with them running
	var mu sync.Mutex
	written := map[string]bool{}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				ids, err := e.writer.Write(ctx, tx, outbox.Message{Topic: "test.new", Payload: []byte("n")})
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					tx.Rollback(ctx)
					t.Error(err)
					return
				}
				mu.Lock()
				written[ids[0]] = true
				mu.Unlock()
			}
		}()
	}
	testenv.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(written) >= 100 }, "producers wrote nothing")
	migrate := exec.Command(relaydBin, "migrate")
	migrate.Env = []string{"RELAY_DATABASE_URL=" + e.dbURL, "RELAY_OUTBOX_TABLE=" + e.table.String()}
	out, err := migrate.CombinedOutput()
	if err != nil {
		t.Fatalf("relayd migrate while relaying: %v\n%s", err, out)
	}
	// A few more rows after it, then the producers stop.
	mu.Lock()
	after := len(written) + 50
	mu.Unlock()
	testenv.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(written) >= after }, "producers stopped at the migration")
	stopProducers()
	wg.Wait()
	maps.Copy(wantAMQP, written)
	maps.Copy(wantNATS, written)

	// The rows of before the migration are in the owed table now, the
	// producers' later ones in the new outbox.
	testenv.Eventually(t, 60*time.Second, func() bool {
		var left int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+pending(e.table)+` WHERE amqp_parked_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}, "rows other than the parked one still in the outbox or the owed table")
	check := func(broker string, got map[string]int, want map[string]bool) {
		missing, extra, dupes := tally(want, got)
		if missing > 0 || extra > 0 || dupes > 0 {
			t.Errorf("%s: owed %d, received %d distinct: %d missing, %d not owed, %d duplicates", broker, len(want), len(got), missing, extra, dupes)
		}
	}
	check("jetstream", e.streamIDs(), wantNATS)
	check("rabbitmq", e.queueIDs(time.Second), wantAMQP)

	var parked int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Owed()+` WHERE topic = 'test.parked' AND amqp_parked_at IS NOT NULL
		AND amqp_last_error = 'poison' AND amqp_delivered_at IS NULL AND amqp_attempts = 5`).Scan(&parked); err != nil || parked != 1 {
		t.Errorf("the parked row after the upgrade: %d rows parked as before (%v), want 1", parked, err)
	}
	var moved, movedSent int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE amqp_sent) FROM `+e.table.Delivered()+`
		WHERE done_at < now() - interval '50 minutes' AND amqp_delivered_at IS NOT NULL AND nats_delivered_at IS NOT NULL`).Scan(&moved, &movedSent); err != nil {
		t.Fatal(err)
	}
	if moved != 50 || movedSent != 50 {
		t.Errorf("rows finished before 00005 in the delivered table: %d (%d with amqp_sent), want 50", moved, movedSent)
	}
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Owed()+` WHERE done_at IS NOT NULL`).Scan(&done); err != nil || done != 0 {
		t.Errorf("rows with done_at left in the owed table: %d, %v", done, err)
	}
	if e.hasIndex("outbox_done") {
		t.Error("the done index is still there after the upgrade")
	}
	// The CHECKs went with the old table, now the owed one.
	if n := testenv.Checks(t, e.pool, schema.Table{Schema: e.table.Schema, Name: e.table.Name + "_owed"}); n != 0 {
		t.Errorf("CHECK constraints on the owed table after the upgrade: %d", n)
	}
	if n := checks(); n != 0 {
		t.Errorf("CHECK constraints on the outbox after the upgrade: %d", n)
	}
	for _, c := range []struct {
		what, q string
		want    []string
	}{
		{"columns", `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
			[]string{"id", "message_id", "topic", "key", "headers", "payload", "created_at"}},
		// pg_index, not pg_indexes cast to regclass: the cast fails on
		// another test's table whose schema is being dropped.
		{"indexes", `SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid WHERE x.indrelid = $1::regclass ORDER BY 1`,
			[]string{"outbox_key_order", "outbox_keyed", "outbox_message_id_key", "outbox_pkey"}},
	} {
		if got := e.names(c.q, tbl); !slices.Equal(got, c.want) {
			t.Errorf("the outbox's %s after the upgrade: %q, want %q", c.what, got, c.want)
		}
	}
	if !e.hasIndex("outbox_owed_message_id") {
		t.Error("no message id index on the owed table after the upgrade")
	}
	if !relay.running() {
		t.Fatalf("relay exited during the upgrade\n%s", relay.out.String())
	}
	if code := relay.stop(30 * time.Second); code != 0 {
		t.Errorf("relay exit %d\n%s", code, relay.out.String())
	}
}

// names runs q, with arg, and returns the names it selects.
func (e *env) names(q string, arg any) []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), q, arg)
	if err != nil {
		e.t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

// hasIndex reports whether the test's outbox schema has an index of that name.
func (e *env) hasIndex(name string) bool {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2`, e.table.Schema, name).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n == 1
}
