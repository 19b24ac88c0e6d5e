package schema_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

func TestParseTable(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    schema.Table
		wantErr bool
	}{
		{in: "outbox", want: schema.Table{Name: "outbox"}},
		{in: "app.outbox", want: schema.Table{Schema: "app", Name: "outbox"}},
		{in: "_x1.o_2", want: schema.Table{Schema: "_x1", Name: "o_2"}},
		{in: "", wantErr: true},
		{in: "Outbox", wantErr: true},
		{in: "a.b.c", wantErr: true},
		{in: "outbox; drop table x", wantErr: true},
		{in: `"outbox"`, wantErr: true},
		{in: "app.", wantErr: true},
		{in: ".outbox", wantErr: true},
		{in: "1outbox", wantErr: true},
		{in: strings.Repeat("a", 41), wantErr: true},
	} {
		got, err := schema.ParseTable(tc.in)
		if tc.wantErr {
			if !errors.Is(err, schema.ErrInvalidTable) {
				t.Errorf("ParseTable(%q) = %v, %v; want ErrInvalidTable", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTable(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if got.String() != tc.in {
			t.Errorf("ParseTable(%q).String() = %q", tc.in, got.String())
		}
	}
}

func FuzzParseTable(f *testing.F) {
	for _, s := range []string{"outbox", "app.outbox", "a.b.c", `x"y`, "", "A.b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tb, err := schema.ParseTable(s)
		if err != nil {
			return
		}
		// A valid name round-trips and quotes to itself plus quotes only.
		if tb.String() != s {
			t.Fatalf("round trip %q -> %q", s, tb.String())
		}
		if strings.ContainsAny(tb.Ident(), ";' \\") {
			t.Fatalf("identifier %q has unsafe characters", tb.Ident())
		}
		if len(tb.Channel()) > 63 {
			t.Fatalf("channel %q too long", tb.Channel())
		}
	})
}

// Several instances migrating the same new table at once: exactly one
// applies each migration, none fails.
func TestUpConcurrent(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	table := schema.Table{Schema: testenv.Name("t"), Name: "outbox"}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+table.Schema+`" CASCADE`) })
	ctx := context.Background()

	const n = 4
	var wg sync.WaitGroup
	applied := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			res, err := schema.Up(ctx, db, table, nil)
			applied[i], errs[i] = len(res), err
		}()
	}
	wg.Wait()
	total := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("instance %d: %v", i, errs[i])
		}
		total += applied[i]
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	st, err := schema.Status(ctx, db, table)
	if err != nil {
		t.Fatal(err)
	}
	if total != len(st) {
		t.Fatalf("migrations applied %d times in all, want %d (once each)", total, len(st))
	}
	if pending, err := schema.Pending(ctx, db, table); err != nil || pending {
		t.Fatalf("Pending = %v, %v; want false", pending, err)
	}

	// The contract: a plain-SQL producer write is valid.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.created', '\x7b7d')`); err != nil {
		t.Fatalf("plain insert: %v", err)
	}
	var mid string
	if err := pool.QueryRow(ctx, `SELECT message_id::text FROM `+table.Ident()).Scan(&mid); err != nil || len(mid) != 36 {
		t.Fatalf("message_id default: %q, %v", mid, err)
	}
	// A row without a topic or a payload is refused at the door; the relay
	// parks the other bad rows.
	for _, q := range []string{
		`INSERT INTO ` + table.Ident() + ` (topic, payload) VALUES (NULL, '\x00')`,
		`INSERT INTO ` + table.Ident() + ` (topic, payload) VALUES ('a', NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err == nil {
			t.Errorf("%s: accepted, want a constraint error", q)
		}
	}
}

// Dropping the CHECKs (00012) needs the outbox to itself for a moment. While
// a transaction holds the outbox, the migration waits its turn without
// stopping producers, and goes through once that transaction ends.
func TestDroppingTheChecksLetsProducersThrough(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	table := schema.Table{Schema: testenv.Name("t"), Name: "outbox"}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+table.Schema+`" CASCADE`) })
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA "`+table.Schema+`"`); err != nil {
		t.Fatal(err)
	}
	p, err := schema.NewProvider(db, table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 11); err != nil {
		t.Fatal(err)
	}
	checks := func() int { return testenv.Checks(t, pool, table) }
	insert := `INSERT INTO ` + table.Ident() + ` (topic, payload) VALUES ('orders.created', '\x00')`

	holder, migrated := behindAHolder(t, pool, p, insert)
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'
			AND query LIKE '%DROP CONSTRAINT IF EXISTS%' AND strpos(query, $1) > 0`, table.Schema).Scan(&n)
		return n == 1
	}, "the migration did not start")
	producersGoThrough(t, pool, insert, 10*time.Second, migrated)
	if n := checks(); n != 2 {
		t.Fatalf("%d CHECKs while the migration waits, want 2", n)
	}

	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	migrationEnds(t, migrated)
	if n := checks(); n != 0 {
		t.Fatalf("%d CHECKs after 00012, want 0", n)
	}
}

// behindAHolder begins a transaction that holds the outbox (an uncommitted
// insert), then migrates up; migrated says when that ends.
func behindAHolder(t *testing.T, pool *pgxpool.Pool, p *goose.Provider, insert string) (pgx.Tx, chan error) {
	t.Helper()
	ctx := context.Background()
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Rollback(ctx) }) //nolint:errcheck // committed by the test
	if _, err := holder.Exec(ctx, insert); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { _, err := p.Up(ctx); migrated <- err }()
	return holder, migrated
}

// producersGoThrough has three producers' inserts each end within wait while
// the migration waits for the holder, which it still does after them.
func producersGoThrough(t *testing.T, pool *pgxpool.Pool, insert string, wait time.Duration, migrated chan error) {
	t.Helper()
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		start := time.Now()
		_, err := pool.Exec(ctx, insert)
		cancel()
		if err != nil {
			t.Fatalf("a producer's insert while the migration waits: %v", err)
		}
		t.Logf("a producer's insert took %v", time.Since(start))
	}
	select {
	case err := <-migrated:
		t.Fatalf("the migration ended while a transaction held the outbox: %v", err)
	default:
	}
}

// migrationEnds waits for the migration to end, without an error, once the
// holder's transaction has.
func migrationEnds(t *testing.T, migrated chan error) {
	t.Helper()
	select {
	case err := <-migrated:
		if err != nil {
			t.Fatalf("migrate after the transaction ended: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the migration did not end 30 s after the transaction holding the outbox")
	}
}

// A migration runs in a transaction or outside one, up and down alike.
func TestNoTransactionMarkerOnBothSides(t *testing.T) {
	fsys := fstest.MapFS{
		"migrations/00001_a.up.sql":   {Data: []byte("-- +relayd no-transaction\nCREATE INDEX CONCURRENTLY i ON {{.Table}} (id);\n")},
		"migrations/00001_a.down.sql": {Data: []byte("DROP INDEX i;\n")},
	}
	_, err := schema.Migrations{FS: fsys}.Provider(nil, schema.Table{Name: "outbox"}, nil)
	if err == nil || !strings.Contains(err.Error(), "00001_a.up.sql: up and down must both run in a transaction, or neither") {
		t.Fatalf("up outside a transaction, down in one: %v", err)
	}
}

// at12 migrates an outbox named name, in a schema of the test's own, to
// version 12: the last with one table, the one 00013 splits.
func at12(t *testing.T, name string) (*pgxpool.Pool, schema.Table, *goose.Provider) {
	t.Helper()
	pool := testenv.Pool(t)
	table := schema.Table{Schema: testenv.Name("t"), Name: name}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+table.Schema+`" CASCADE`) })
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA "`+table.Schema+`"`); err != nil {
		t.Fatal(err)
	}
	p, err := schema.NewProvider(db, table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 12); err != nil {
		t.Fatal(err)
	}
	return pool, table, p
}

// Require passes a table at the newest migration, the minimum, and refuses
// one a migration behind it, or never migrated, saying what it is at, what
// is needed and what to run.
func TestRequireTheMinimum(t *testing.T) {
	t.Parallel()
	pool, table, p := at12(t, "outbox")
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	sources := p.ListSources()
	if newest := sources[len(sources)-1].Version; schema.Minimum() != newest {
		t.Fatalf("Minimum() = %d, want the newest migration, %d", schema.Minimum(), newest)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := schema.Require(ctx, db, table); err != nil {
		t.Fatalf("Require at the newest migration: %v", err)
	}
	if _, err := p.DownTo(ctx, schema.Minimum()-1); err != nil {
		t.Fatal(err)
	}
	never := schema.Table{Schema: table.Schema, Name: "never"}
	for _, c := range []struct {
		table   schema.Table
		version int64
	}{{table, schema.Minimum() - 1}, {never, 0}} {
		err := schema.Require(ctx, db, c.table)
		var outdated *schema.OutdatedError
		if !errors.As(err, &outdated) || *outdated != (schema.OutdatedError{Table: c.table, Version: c.version, Minimum: schema.Minimum()}) {
			t.Fatalf("Require of %s at %d: %v, want an OutdatedError", c.table, c.version, err)
		}
		want := fmt.Sprintf("outbox table %s is not migrated: it is at migration %d, this relayd needs %d: run `relayd migrate`", c.table, c.version, schema.Minimum())
		if err.Error() != want {
			t.Errorf("Require's error: %q, want %q", err, want)
		}
	}
}

// userTriggersSQL counts the triggers of the table $1 not made by Postgres.
const userTriggersSQL = `SELECT count(*)::text FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal`

// createdAtDefaultSQL is created_at's default in the table $1, as Postgres
// prints it: the wake-up since 00016.
const createdAtDefaultSQL = `SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
	JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
	WHERE d.adrelid = $1::regclass AND a.attname = 'created_at'`

// exec runs each statement, failing the test on the first error.
func exec(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := pool.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// query is the text of a single-value query.
func query(t *testing.T, pool *pgxpool.Pool, q string, args ...any) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return s
}

// rowsOf is every row of rel (those matching where, if given) with all its
// columns, in id order: what a migration must keep exactly. A route column
// (00019) that is NULL is left out: a row not routed yet compares equal to
// itself before 00019.
func rowsOf(t *testing.T, pool *pgxpool.Pool, rel string, where ...string) string {
	t.Helper()
	q := `SELECT coalesce(jsonb_agg((SELECT jsonb_object_agg(j.key, j.value) FROM jsonb_each(to_jsonb(o)) j
		WHERE NOT (j.key IN ('amqp_exchange', 'amqp_routing_key', 'nats_subject', 'nats_stream') AND j.value = 'null'::jsonb)) ORDER BY id), '[]')::text FROM ` + rel + ` o`
	if len(where) > 0 {
		q += ` WHERE ` + where[0]
	}
	return query(t, pool, q)
}

// shapeOf is rel's columns, constraints, indexes, triggers and storage
// options: a down migration must give back the shape the up one started from.
func shapeOf(t *testing.T, pool *pgxpool.Pool, rel string) string {
	t.Helper()
	return query(t, pool, `SELECT concat_ws(E'\n',
		(SELECT string_agg(format('%s %s %s %s %s', attname, format_type(atttypid, atttypmod), attnotnull, attidentity,
			pg_get_expr(d.adbin, d.adrelid)), E'\n' ORDER BY attnum)
			FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped),
		(SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), E'\n' ORDER BY conname)
			FROM pg_constraint WHERE conrelid = $1::regclass),
		(SELECT string_agg(pg_get_indexdef(indexrelid), E'\n' ORDER BY indexrelid::regclass::text)
			FROM pg_index WHERE indrelid = $1::regclass),
		(SELECT string_agg(pg_get_triggerdef(oid), E'\n' ORDER BY tgname)
			FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal),
		(SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::regclass))`, rel)
}

// stateRows inserts, at version 12, rows in each delivery state a relay
// leaves them in, and deletes the last, as a delivery would: the sequence
// is then past every id left.
func stateRows(t *testing.T, pool *pgxpool.Pool, table schema.Table) {
	t.Helper()
	exec(t, pool, `INSERT INTO `+table.Ident()+` (topic, key, headers, payload,
		amqp_delivered_at, amqp_attempts, amqp_retry_at, amqp_parked_at, amqp_last_error,
		nats_delivered_at, nats_attempts, nats_retry_at, nats_parked_at, nats_last_error) VALUES
		('orders.created', NULL, NULL, '\x01', NULL, 0, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL),
		('orders.paid', 'k1', '{"h": "v"}', '\x02', now(), 1, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL),
		('orders.paid', 'k1', NULL, '\x03', now(), 1, NULL, NULL, NULL, NULL, 5, NULL, now(), 'nats: maximum payload exceeded'),
		('orders.shipped', NULL, NULL, '\x04', NULL, 2, now() + interval '1 minute', NULL, 'amqp: channel closed', now(), 1, NULL, NULL, NULL),
		('orders.gone', NULL, NULL, '\x05', NULL, 0, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL)`,
		`DELETE FROM `+table.Ident()+` WHERE topic = 'orders.gone'`)
}

// 00013 moves the outbox, every row with its state, to <name>_owed, and
// puts an empty outbox of the producers' columns in its place, ids going on
// past every id handed out.
func TestOwedUpgradeKeepsRowsAndState(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"outbox", "app_events"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, table, p := at12(t, name)
			ctx := context.Background()
			stateRows(t, pool, table)
			// A producer whose driver keeps its insert prepared across the
			// migration: Postgres plans it again, for the new outbox.
			producer, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Release()
			prepared := `INSERT INTO ` + table.Ident() + ` (topic, payload) VALUES ($1, $2) RETURNING id`
			var id int64
			if err := producer.QueryRow(ctx, prepared, "orders.created", []byte{0}).Scan(&id); err != nil {
				t.Fatal(err)
			}
			before := rowsOf(t, pool, table.Ident())
			lastID := query(t, pool, `SELECT last_value::text FROM `+query(t, pool, `SELECT pg_get_serial_sequence($1, 'id')`, table.Ident()))
			if _, err := p.Up(ctx); err != nil {
				t.Fatal(err)
			}

			if got := rowsOf(t, pool, table.Owed()); got != before {
				t.Errorf("%s after 00013:\n%s\nwant the outbox's rows at 12:\n%s", table.Owed(), got, before)
			}
			if got := rowsOf(t, pool, table.Ident()); got != "[]" {
				t.Errorf("the new outbox holds %s, want no rows", got)
			}
			// Each query's $1 is rel.
			outbox, owed := table.Ident(), table.Owed()
			for _, tc := range []struct{ what, rel, q, want string }{
				{"columns", outbox, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
					FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`,
					"id bigint, message_id uuid, topic text, key text, headers jsonb, payload bytea, created_at timestamp with time zone"},
				{"indexes", outbox, `SELECT string_agg(c.relname, ', ' ORDER BY c.relname) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
					WHERE i.indrelid = $1::regclass`,
					name + "_key_order, " + name + "_keyed, " + name + "_message_id_key, " + name + "_pkey"},
				{"constraints", outbox, `SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), ', ' ORDER BY conname)
					FROM pg_constraint WHERE conrelid = $1::regclass`,
					name + "_message_id_key UNIQUE (message_id), " + name + "_pkey PRIMARY KEY (id)"},
				// Since 00018 the id is taken after the transaction's id.
				{"identity", outbox, `SELECT attidentity::text FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'id'`, ""},
				{"id", outbox, `SELECT btrim(regexp_replace((` + strings.ReplaceAll(createdAtDefaultSQL, "'created_at'", "'id'") + `), '\s+', ' ', 'g'))`,
					fmt.Sprintf(`CASE WHEN (pg_current_xact_id() IS NOT NULL) THEN nextval('%s.%s_id_seq'::regclass) ELSE NULL::bigint END`, table.Schema, name)},
				{"triggers", outbox, userTriggersSQL, "0"},
				{"wake-up", outbox, `SELECT btrim(regexp_replace((` + createdAtDefaultSQL + `), '\s+', ' ', 'g'))`,
					fmt.Sprintf(`CASE WHEN pg_try_advisory_xact_lock_shared('%d'::bigint) THEN now() ELSE %s.%s_wake('%s'::text) END`,
						table.WakeLock(), table.Schema, name, table.Channel())},
				{"functions", outbox, `SELECT string_agg(proname, ', ' ORDER BY proname) FROM pg_proc
					WHERE pronamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::regclass)`,
					name + "_wake"},
				{"owed constraints", owed, `SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), ', ' ORDER BY conname)
					FROM pg_constraint WHERE conrelid = $1::regclass`,
					name + "_owed_pkey PRIMARY KEY (id)"},
				{"owed triggers", owed, userTriggersSQL, "0"},
				{"owed identity", owed, `SELECT attidentity::text FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'id'`, ""},
				{"owed message id index", owed, `SELECT pg_get_indexdef(indexrelid) || ' ' || indisvalid FROM pg_index
					WHERE indrelid = $1::regclass AND indexrelid::regclass::text LIKE '%owed_message_id'`,
					`CREATE INDEX ` + name + `_owed_message_id ON ` + table.Schema + `.` + name + `_owed USING btree (message_id) true`},
				// Since 00020 the cleanup finds the stranded rows by their own index.
				{"owed in-nats index", owed, `SELECT pg_get_indexdef(indexrelid) || ' ' || indisvalid FROM pg_index
					WHERE indrelid = $1::regclass AND indexrelid::regclass::text LIKE '%owed_in_nats'`,
					`CREATE INDEX ` + name + `_owed_in_nats ON ` + table.Schema + `.` + name + `_owed USING btree (id) WHERE ((nats_delivered_at IS NOT NULL) AND (done_at IS NULL)) true`},
			} {
				var got pgtype.Text
				if err := pool.QueryRow(ctx, tc.q, tc.rel).Scan(&got); err != nil {
					t.Errorf("%s: %v", tc.what, err)
				} else if !got.Valid || got.String != tc.want {
					t.Errorf("%s: %q (valid %v), want %q", tc.what, got.String, got.Valid, tc.want)
				}
			}

			// The contract: a plain-SQL producer write, its id past every
			// one handed out at version 12; and the prepared one's.
			if err := pool.QueryRow(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.created', '\x7b7d') RETURNING id`).Scan(&id); err != nil {
				t.Fatalf("plain insert: %v", err)
			}
			var preparedID int64
			if err := producer.QueryRow(ctx, prepared, "orders.created", []byte{0}).Scan(&preparedID); err != nil {
				t.Fatalf("insert prepared before the migration: %v", err)
			}
			last, _ := strconv.ParseInt(lastID, 10, 64)
			for _, id := range []int64{id, preparedID} {
				if id <= last {
					t.Errorf("new row's id %d, want past %d, the last handed out before 00013", id, last)
				}
			}
			if n := query(t, pool, `SELECT count(*)::text FROM `+table.Ident()); n != "2" {
				t.Errorf("%s rows in the new outbox, want the 2 inserted", n)
			}
		})
	}
}

// The trigger of 00013 wakes a relay waiting for rows, as 00007's did: a
// waiting relay holds the wake lock and listens.
func TestOwedUpgradeWakesTheWaitingRelay(t *testing.T) {
	t.Parallel()
	pool, table, p := at12(t, "outbox")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	relay := waitingRelay(t, pool, table, table)
	exec(t, pool, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.created', '\x00')`)
	notifiedOn(ctx, t, relay, table, "migrated up")
}

// waitingRelay is a session as a relay waiting for rows of table has it:
// holding table's wake lock, listening on the channels of listen.
func waitingRelay(t *testing.T, pool *pgxpool.Pool, table schema.Table, listen ...schema.Table) *pgxpool.Conn {
	t.Helper()
	ctx := context.Background()
	relay, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		relay.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`) //nolint:errcheck // the session is let go either way
		relay.Release()
	})
	if _, err := relay.Exec(ctx, `SELECT pg_advisory_lock($1)`, table.WakeLock()); err != nil {
		t.Fatal(err)
	}
	for _, tb := range listen {
		if _, err := relay.Exec(ctx, `LISTEN "`+tb.Channel()+`"`); err != nil {
			t.Fatal(err)
		}
	}
	return relay
}

// notifiedOn waits for relay's next notification and fails the test unless
// it came on want's channel; when says at which version.
func notifiedOn(ctx context.Context, t *testing.T, relay *pgxpool.Conn, want schema.Table, when string) {
	t.Helper()
	n, err := relay.Conn().WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("%s: no notification of an insert while the relay waits: %v", when, err)
	}
	if n.Channel != want.Channel() {
		t.Fatalf("%s: notified on %q, want only %q, the table whose wake lock the relay holds", when, n.Channel, want.Channel())
	}
}

// twoTablesAt is two outboxes, each in a schema of its own, migrated to
// version.
func twoTablesAt(t *testing.T, version int64) (pool *pgxpool.Pool, a, b schema.Table, pa, pb *goose.Provider) {
	t.Helper()
	pool, a, pa = at12(t, "outbox")
	_, b, pb = at12(t, "outbox")
	for _, p := range []*goose.Provider{pa, pb} {
		if _, err := p.UpTo(context.Background(), version); err != nil {
			t.Fatal(err)
		}
	}
	return pool, a, b, pa, pb
}

// Since 00015 a table's wake function has its own channel and lock key in its
// body, not in TG_ARGV (reading them there cost each insert a quarter of the
// trigger): a relay waiting on one table is woken by that table's inserts
// only, and down to 14 the function reads the arguments again.
func TestWakeFunctionHoldsItsTablesKeys(t *testing.T) {
	t.Parallel()
	pool, a, b, pa, _ := twoTablesAt(t, 15)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := func(tb schema.Table) string {
		return query(t, pool, `SELECT prosrc FROM pg_proc WHERE oid = ($1 || '()')::regprocedure`, tb.Side("wake"))
	}
	for _, tb := range []schema.Table{a, b} {
		src := body(tb)
		if strings.Contains(src, "TG_ARGV") || !strings.Contains(src, strconv.FormatInt(tb.WakeLock(), 10)) || !strings.Contains(src, "'"+tb.Channel()+"'") {
			t.Errorf("%s's wake function, want its lock key and channel and no TG_ARGV:\n%s", tb, src)
		}
	}

	relay := waitingRelay(t, pool, a, a, b)
	// b's commit comes first: a notification of it would arrive first.
	exec(t, pool, `INSERT INTO `+b.Ident()+` (topic, payload) VALUES ('orders.created', '\x00')`,
		`INSERT INTO `+a.Ident()+` (topic, payload) VALUES ('orders.created', '\x00')`)
	notifiedOn(ctx, t, relay, a, "at 15")

	if _, err := pa.DownTo(ctx, 14); err != nil {
		t.Fatal(err)
	}
	if src := body(a); !strings.Contains(src, "TG_ARGV[1]") {
		t.Errorf("the wake function at 14, want it reading TG_ARGV:\n%s", src)
	}
	exec(t, pool, `INSERT INTO `+a.Ident()+` (topic, payload) VALUES ('orders.created', '\x00')`)
	notifiedOn(ctx, t, relay, a, "at 14")
}

// Since 00016 the wake-up is in created_at's default, the trigger gone: a
// relay waiting on one table is woken by that table's inserts only, with the
// key and channel of the trigger it replaced (which running relays read,
// whatever spelling the migration was given); down to 15 the trigger is back.
func TestWakeDefaultKeepsTheTriggersKeys(t *testing.T) {
	t.Parallel()
	pool, a, b, pa, pb := twoTablesAt(t, 15)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// b as migrated under another spelling: other keys in its trigger.
	other := schema.Table{Name: b.Schema + "_" + b.Name}
	exec(t, pool, `DROP TRIGGER outbox_notify ON `+b.Ident(),
		fmt.Sprintf(`CREATE TRIGGER outbox_notify AFTER INSERT ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s('%s', '%d')`,
			b.Ident(), b.Side("wake"), other.Channel(), other.WakeLock()))
	for _, p := range []*goose.Provider{pa, pb} {
		if _, err := p.Up(ctx); err != nil {
			t.Fatal(err)
		}
	}
	dflt := func(tb schema.Table) string { return query(t, pool, createdAtDefaultSQL, tb.Ident()) }
	for _, c := range []struct{ table, keys schema.Table }{{a, a}, {b, other}} {
		if n := query(t, pool, userTriggersSQL, c.table.Ident()); n != "0" {
			t.Errorf("%s: %s triggers at 16, want none", c.table, n)
		}
		if d := dflt(c.table); !strings.Contains(d, strconv.FormatInt(c.keys.WakeLock(), 10)) || !strings.Contains(d, "'"+c.keys.Channel()+"'") {
			t.Errorf("%s: created_at's default, want the lock key %d and channel %s:\n%s", c.table, c.keys.WakeLock(), c.keys.Channel(), d)
		}
	}

	relay := waitingRelay(t, pool, a, a, b, other)
	// b's commit comes first: a notification of it would arrive first. Either
	// way created_at is the transaction's now().
	for _, tb := range []schema.Table{b, a} {
		if got := query(t, pool, `INSERT INTO `+tb.Ident()+` (topic, payload) VALUES ('orders.created', '\x00') RETURNING (created_at = now())::text`); got != "true" {
			t.Errorf("%s: created_at is not the transaction's now()", tb)
		}
	}
	notifiedOn(ctx, t, relay, a, "at 16")

	if _, err := pa.DownTo(ctx, 15); err != nil {
		t.Fatal(err)
	}
	if d := dflt(a); d != "now()" {
		t.Errorf("created_at's default at 15: %s, want now()", d)
	}
	args := query(t, pool, `SELECT encode(tgargs, 'escape') FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = 'outbox_notify'`, a.Ident())
	if want := a.Channel() + `\000` + strconv.FormatInt(a.WakeLock(), 10) + `\000`; args != want {
		t.Errorf("the trigger's arguments at 15: %q, want %q", args, want)
	}
	exec(t, pool, `INSERT INTO `+a.Ident()+` (topic, payload) VALUES ('orders.created', '\x00')`)
	notifiedOn(ctx, t, relay, a, "at 15")
}

// 00016 sets a default, an ACCESS EXCLUSIVE lock: while a transaction holds
// the outbox, producers' inserts still go through, and the migration ends
// once that transaction has.
func TestWakeDefaultLetsProducersThrough(t *testing.T) {
	t.Parallel()
	pool, table, p := at12(t, "outbox")
	ctx := context.Background()
	if _, err := p.UpTo(ctx, 15); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO ` + table.Ident() + ` (topic, payload) VALUES ('orders.created', '\x00')`
	holder, migrated := behindAHolder(t, pool, p, insert)
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'
			AND query LIKE '%RETURNS timestamptz%' AND strpos(query, $1) > 0`, table.Schema).Scan(&n) // within its first 1 KiB
		return n == 1
	}, "the migration did not start")
	producersGoThrough(t, pool, insert, 10*time.Second, migrated)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	migrationEnds(t, migrated)
	if n := query(t, pool, userTriggersSQL, table.Ident()); n != "0" {
		t.Fatalf("%s triggers after 00016, want none", n)
	}
}

// The producers' grants, table and column ones, and the owner go to the new
// outbox: producers keep writing under their own roles. The second case's
// names need quoting.
func TestOwedUpgradeCarriesOwnerAndGrants(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, owner, producer string }{
		{"plain", testenv.Name("owner"), testenv.Name("producer")},
		{"quoted", "Owner-" + testenv.Name("x"), "Producer " + testenv.Name("x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, table, p := at12(t, "outbox")
			ctx := context.Background()
			owner, producer := pgx.Identifier{tc.owner}.Sanitize(), pgx.Identifier{tc.producer}.Sanitize()
			for _, r := range []string{owner, producer} {
				exec(t, pool, `CREATE ROLE `+r)
				// Before the schema's cleanup (cleanups run last-registered first):
				// DROP ROLE needs the role's tables and grants gone.
				t.Cleanup(func() { pool.Exec(context.Background(), `DROP OWNED BY `+r+`; DROP ROLE IF EXISTS `+r) })
			}
			exec(t, pool,
				`ALTER TABLE `+table.Ident()+` OWNER TO `+owner,
				`GRANT USAGE ON SCHEMA "`+table.Schema+`" TO `+producer,
				`GRANT INSERT ON `+table.Ident()+` TO `+producer,
				`GRANT SELECT (topic) ON `+table.Ident()+` TO `+producer,
				`GRANT UPDATE (key) ON `+table.Ident()+` TO `+producer+` WITH GRANT OPTION`,
				`GRANT SELECT (created_at) ON `+table.Ident()+` TO PUBLIC`,
				`GRANT USAGE ON SEQUENCE `+query(t, pool, `SELECT pg_get_serial_sequence($1, 'id')`, table.Ident())+` TO `+producer)
			if _, err := p.Up(ctx); err != nil {
				t.Fatal(err)
			}

			if got := query(t, pool, `SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = $1::regclass`, table.Ident()); got != tc.owner {
				t.Errorf("the new outbox's owner is %q, want %q", got, tc.owner)
			}
			for _, c := range []struct {
				role, q string
				want    bool
			}{
				{tc.producer, `SELECT has_table_privilege($1, $2, 'INSERT')`, true},
				{tc.producer, `SELECT has_column_privilege($1, $2, 'topic', 'SELECT')`, true},
				{tc.producer, `SELECT has_column_privilege($1, $2, 'key', 'UPDATE WITH GRANT OPTION')`, true},
				{"public", `SELECT has_column_privilege($1, $2, 'created_at', 'SELECT')`, true},
				{tc.producer, `SELECT has_sequence_privilege($1, pg_get_serial_sequence($2, 'id'), 'USAGE')`, true},
				// Only what was granted: a column grant is no table grant.
				{tc.producer, `SELECT has_table_privilege($1, $2, 'SELECT')`, false},
				{tc.producer, `SELECT has_column_privilege($1, $2, 'payload', 'SELECT')`, false},
				{tc.producer, `SELECT has_table_privilege($1, $2, 'DELETE')`, false},
				{"public", `SELECT has_table_privilege($1, $2, 'INSERT')`, false},
			} {
				var got bool
				if err := pool.QueryRow(ctx, c.q, c.role, table.Ident()).Scan(&got); err != nil {
					t.Fatalf("%s: %v", c.q, err)
				}
				if got != c.want {
					t.Errorf("%s for %s: %v, want %v", c.q, c.role, got, c.want)
				}
			}

			// What a producer's own role does: insert, and read the id given
			// with currval, which takes the grant on the sequence.
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+producer); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.created', '\x00')`); err != nil {
				t.Fatalf("insert as %s: %v", tc.producer, err)
			}
			if _, err := tx.Exec(ctx, `SELECT currval(pg_get_serial_sequence($1, 'id'))`, table.Ident()); err != nil {
				t.Fatalf("currval as %s: %v", tc.producer, err)
			}
		})
	}
}

// What would follow the rename to <name>_owed, and stop working for the
// producers' table, makes 00013 refuse, naming it, and change nothing; once
// it is dropped, the migration goes through.
func TestOwedUpgradeRefusesWhatWouldFollowTheRename(t *testing.T) {
	t.Parallel()
	pub := testenv.Name("pub")
	for _, tc := range []struct {
		name         string
		create, drop string // {outbox} is the outbox, {schema} its schema
		want         string // in the error
	}{
		{"view", `CREATE VIEW "{schema}".outbox_parked_view AS SELECT id FROM {outbox} WHERE amqp_parked_at IS NOT NULL`,
			`DROP VIEW "{schema}".outbox_parked_view`, `view {schema}.outbox_parked_view`},
		{"foreign key", `CREATE TABLE "{schema}".orders (id bigint PRIMARY KEY, outbox_id bigint REFERENCES {outbox} (id))`,
			`DROP TABLE "{schema}".orders`, `foreign key orders_outbox_id_fkey of {schema}.orders`},
		{"policy", `CREATE POLICY producers ON {outbox} USING (topic LIKE 'orders.%')`,
			`DROP POLICY producers ON {outbox}`, `policy producers`},
		{"publication", `CREATE PUBLICATION ` + pub + ` FOR TABLE {outbox}`,
			`DROP PUBLICATION ` + pub, `publication ` + pub},
		{"trigger", `CREATE FUNCTION "{schema}".audit() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
			CREATE TRIGGER outbox_audit AFTER INSERT ON {outbox} FOR EACH ROW EXECUTE FUNCTION "{schema}".audit()`,
			`DROP TRIGGER outbox_audit ON {outbox}`, `trigger outbox_audit`},
		{"rule", `CREATE RULE outbox_copy AS ON INSERT TO {outbox} DO ALSO NOTIFY outbox_copy`,
			`DROP RULE outbox_copy ON {outbox}`, `rule outbox_copy`},
		{"function", `CREATE FUNCTION "{schema}".enqueue(t text) RETURNS void LANGUAGE sql
			BEGIN ATOMIC INSERT INTO {outbox} (topic, payload) VALUES (t, '\x00'); END`,
			`DROP FUNCTION "{schema}".enqueue(text)`, `function {schema}.enqueue(text)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, table, p := at12(t, "outbox")
			ctx := context.Background()
			if tc.name == "publication" {
				t.Cleanup(func() { pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+pub) })
			}
			stateRows(t, pool, table)
			in := strings.NewReplacer("{outbox}", table.Ident(), "{schema}", table.Schema).Replace
			exec(t, pool, in(tc.create))
			rows, shape := rowsOf(t, pool, table.Ident()), shapeOf(t, pool, table.Ident())

			_, err := p.Up(ctx)
			if want := in(tc.want); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Up with a %s on the outbox: %v; want an error naming %q", tc.name, err, want)
			}
			if v, err := p.GetDBVersion(ctx); err != nil || v != 12 {
				t.Errorf("version after the refusal: %d, %v; want 12", v, err)
			}
			if got := rowsOf(t, pool, table.Ident()); got != rows {
				t.Errorf("rows after the refusal:\n%s\nwant\n%s", got, rows)
			}
			if got := shapeOf(t, pool, table.Ident()); got != shape {
				t.Errorf("outbox after the refusal:\n%s\nwant\n%s", got, shape)
			}
			if got := query(t, pool, `SELECT coalesce(to_regclass($1)::text, '')`, table.Owed()); got != "" {
				t.Errorf("%s exists after the refusal", got)
			}

			exec(t, pool, in(tc.drop))
			if _, err := p.Up(ctx); err != nil {
				t.Fatalf("Up once the %s is dropped: %v", tc.name, err)
			}
			if got := rowsOf(t, pool, table.Owed()); got != rows {
				t.Errorf("%s:\n%s\nwant\n%s", table.Owed(), got, rows)
			}
		})
	}
}

// 00013 needs the outbox to itself for a moment. While a transaction holds
// the outbox, the migration waits its turn without stopping producers, and
// goes through once that transaction ends.
func TestOwedUpgradeLetsProducersThrough(t *testing.T) {
	t.Parallel()
	pool, table, p := at12(t, "outbox")
	ctx := context.Background()
	insert := `INSERT INTO ` + table.Ident() + ` (topic, payload) VALUES ('orders.created', '\x00')`

	holder, migrated := behindAHolder(t, pool, p, insert)
	// The migration is in its loop once it has asked for the lock.
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND mode = 'AccessExclusiveLock' AND NOT granted`,
			table.Ident()).Scan(&n)
		return n == 1
	}, "the migration did not ask for the outbox's lock")
	producersGoThrough(t, pool, insert, 5*time.Second, migrated)
	if got := query(t, pool, `SELECT coalesce(to_regclass($1)::text, '')`, table.Owed()); got != "" {
		t.Fatalf("%s exists while the migration waits", got)
	}

	// The holder ends while a producer queues behind the migration's lock
	// request: the producer goes through after the migration, wherever
	// the outbox's name then leads. Inserts go through between tries until
	// one queues.
	waiting := func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND mode = 'RowExclusiveLock' AND NOT granted`,
			table.Ident()).Scan(&n)
		return n == 1
	}
	var queued chan error
	var tries int
	for deadline := time.Now().Add(30 * time.Second); queued == nil; tries++ {
		if time.Now().After(deadline) {
			t.Fatalf("no producer's insert queued behind the migration in 30 s (%d inserts)", tries)
		}
		done := make(chan error, 1)
		go func() {
			_, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.queued', '\x00')`)
			done <- err
		}()
		testenv.Eventually(t, 10*time.Second, func() bool { return len(done) == 1 || waiting() }, "a producer's insert neither ended nor queued")
		if waiting() {
			queued = done
		} else if err := <-done; err != nil {
			t.Fatalf("a producer's insert while the migration waits: %v", err)
		}
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	migrationEnds(t, migrated)
	select {
	case err := <-queued:
		if err != nil {
			t.Fatalf("the insert queued behind the migration: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the insert queued behind the migration did not end 10 s after it")
	}
	// Each insert once: the holder's and the first producers' in the old
	// table, now owed; the queued one's in either.
	if n := query(t, pool, `SELECT count(*)::text FROM `+table.Owed()+` WHERE topic = 'orders.created'`); n != "4" {
		t.Errorf("%s rows of the holder and the producers in %s, want 4", n, table.Owed())
	}
	inNew := query(t, pool, `SELECT count(*)::text FROM `+table.Ident()+` WHERE topic = 'orders.queued'`)
	if n := query(t, pool, `SELECT (count(*) + $1::int)::text FROM `+table.Owed()+` WHERE topic = 'orders.queued'`, inNew); n != strconv.Itoa(tries) {
		t.Errorf("%s rows of %d inserts between and behind tries", n, tries)
	}
	t.Logf("%d inserts between and behind tries; the queued one in the new outbox: %s", tries, inNew)
	exec(t, pool, insert)
	if n := query(t, pool, `SELECT count(*)::text FROM `+table.Ident()+` WHERE topic = 'orders.created'`); n != "1" {
		t.Errorf("%s rows in the new outbox, want 1", n)
	}
}

// Down from 14 to 12 gives back the one table as it was, holding the rows
// of both, and ids go on past every one handed out; up again works.
func TestOwedDownRoundTrip(t *testing.T) {
	t.Parallel()
	pool, table, p := at12(t, "outbox")
	ctx := context.Background()
	stateRows(t, pool, table)
	shape, old := shapeOf(t, pool, table.Ident()), rowsOf(t, pool, table.Ident())
	oldLast := query(t, pool, `SELECT max(id)::text FROM `+table.Ident())
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `INSERT INTO `+table.Ident()+` (topic, key, payload) VALUES ('orders.created', 'k2', '\x06'), ('orders.created', NULL, '\x07')`)
	newIDs := query(t, pool, `SELECT array_agg(id ORDER BY id)::text FROM `+table.Ident())
	// A row a batch left owed after the upgrade.
	testenv.SetState(t, pool, table, `nats_attempts = 1, nats_retry_at = now()`, `key = 'k2'`)
	owedRow := rowsOf(t, pool, table.Owed(), `key = 'k2'`)
	var lastID int64
	if err := pool.QueryRow(ctx, `SELECT last_value FROM `+query(t, pool, `SELECT pg_get_serial_sequence($1, 'id')`, table.Ident())).Scan(&lastID); err != nil {
		t.Fatal(err)
	}

	if _, err := p.DownTo(ctx, 12); err != nil {
		t.Fatal(err)
	}
	if got := shapeOf(t, pool, table.Ident()); got != shape {
		t.Errorf("the outbox after down to 12:\n%s\nwant its shape at 12:\n%s", got, shape)
	}
	if got := query(t, pool, `SELECT coalesce(to_regclass($1)::text, '')`, table.Owed()); got != "" {
		t.Errorf("%s exists after down to 12", got)
	}
	if got := query(t, pool, `SELECT coalesce(string_agg(proname, ', ' ORDER BY proname), '') FROM pg_proc WHERE pronamespace = $1::regnamespace`, table.Schema); got != "outbox_notify" {
		t.Errorf("functions after down to 12: %q, want outbox_notify", got)
	}
	// The old rows as they were, the owed one with its state, the other
	// new one owed to every target.
	if got := rowsOf(t, pool, table.Ident(), `id <= `+oldLast); got != old {
		t.Errorf("the rows of version 12 after the round trip:\n%s\nwant\n%s", got, old)
	}
	if got := rowsOf(t, pool, table.Ident(), `key = 'k2'`); got != owedRow {
		t.Errorf("the row owed after the upgrade:\n%s\nwant\n%s", got, owedRow)
	}
	if got := query(t, pool, `SELECT array_agg(id ORDER BY id)::text FROM `+table.Ident()+` WHERE topic = 'orders.created' AND payload IN ('\x06', '\x07')`); got != newIDs {
		t.Errorf("ids of the rows inserted after the upgrade: %s, want %s", got, newIDs)
	}
	if n := query(t, pool, `SELECT count(*)::text FROM `+table.Ident()+` WHERE payload = '\x07'
		AND amqp_attempts = 0 AND nats_attempts = 0 AND amqp_delivered_at IS NULL AND nats_delivered_at IS NULL`); n != "1" {
		t.Errorf("the unclaimed new row is not owed to every target (%s)", n)
	}

	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.created', '\x08') RETURNING id`).Scan(&id); err != nil {
		t.Fatalf("plain insert after down: %v", err)
	}
	if id <= lastID {
		t.Errorf("id after down %d, want past %d", id, lastID)
	}
	mid := query(t, pool, `SELECT message_id::text FROM `+table.Ident()+` WHERE id = $1`, id)
	_, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (message_id, topic, payload) VALUES ($1, 'orders.created', '\x09')`, mid)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != "outbox_message_id_key" {
		t.Errorf("a message id again after down: %v, want a unique violation of outbox_message_id_key", err)
	}

	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if n := query(t, pool, `SELECT count(*)::text FROM `+table.Owed()); n != "7" {
		t.Errorf("%s rows in %s after up again, want 7", n, table.Owed())
	}
}

// A build of 00014's index that failed leaves an invalid index of its name;
// the next run builds a valid one instead of keeping it.
func TestOwedMessageIDIndexAfterAFailedBuild(t *testing.T) {
	t.Parallel()
	pool, table, p := at12(t, "outbox")
	ctx := context.Background()
	if _, err := p.UpTo(ctx, 13); err != nil {
		t.Fatal(err)
	}
	// A build of that name that fails (here: unique over a repeated topic),
	// as a cancelled one would, leaves the index invalid.
	exec(t, pool, `INSERT INTO `+table.Owed()+` (id, message_id, topic, payload) VALUES
		(1, '00000000-0000-4000-8000-000000000001', 'orders.created', '\x00'),
		(2, '00000000-0000-4000-8000-000000000002', 'orders.created', '\x00')`)
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY outbox_owed_message_id ON `+table.Owed()+` (topic)`); err == nil {
		t.Fatal("a unique index over a repeated topic was built")
	}
	valid := func() string {
		return query(t, pool, `SELECT indisvalid || ' ' || indisunique FROM pg_index WHERE indexrelid = $1::regclass`, table.Side("owed_message_id"))
	}
	if v := valid(); v != "false true" {
		t.Fatalf("the failed build's index: valid, unique = %s; want false true", v)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if v := valid(); v != "true false" {
		t.Fatalf("the index after 00014: valid, unique = %s; want true false", v)
	}
}

// Since 00013 a producer may insert a message id again, once its row moved
// to <name>_owed; the one table of 12 takes each id once, so down refuses,
// naming an id, and changes nothing until the copy is gone.
func TestOwedDownRefusesARepeatedMessageID(t *testing.T) {
	t.Parallel()
	pool, table, p := at12(t, "outbox")
	ctx := context.Background()
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	const mid = "00000000-0000-4000-8000-000000000007"
	insert := `INSERT INTO ` + table.Ident() + ` (message_id, topic, payload) VALUES ('` + mid + `', 'orders.created', '\x00')`
	exec(t, pool, insert)
	testenv.SetState(t, pool, table, `nats_attempts = 1`, `message_id = $1`, mid)
	exec(t, pool, insert)
	rows, owed := rowsOf(t, pool, table.Ident()), rowsOf(t, pool, table.Owed())

	_, err := p.DownTo(ctx, 12)
	if want := "more than once (1 of them, " + mid + " for one)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("down with a message id in both tables: %v; want an error with %q", err, want)
	}
	if got := rowsOf(t, pool, table.Ident()); got != rows {
		t.Errorf("the outbox after the refusal:\n%s\nwant\n%s", got, rows)
	}
	if got := rowsOf(t, pool, table.Owed()); got != owed {
		t.Errorf("%s after the refusal:\n%s\nwant\n%s", table.Owed(), got, owed)
	}

	exec(t, pool, `DELETE FROM `+table.Ident()+` WHERE message_id = '`+mid+`'`)
	if _, err := p.DownTo(ctx, 12); err != nil {
		t.Fatalf("down once the copy is gone: %v", err)
	}
	if got := rowsOf(t, pool, table.Ident()); got != owed {
		t.Errorf("the outbox after down:\n%s\nwant the owed row:\n%s", got, owed)
	}
}

// Since 00018 a row's id is taken once its transaction has a transaction
// id: a claim's snapshot that cannot see the row shows its transaction
// running. Seen from another session while a BEFORE trigger holds the
// insert, after the id was taken and before the row is written: at 17 (an
// identity) the transaction has no id yet, the gap 00018 closes. (A
// sequence's nextval assigns one only when it writes WAL, once per 32 ids
// or after a checkpoint: the row inserted first takes that one.)
func TestIDIsTakenAfterTheTransactionID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version int64
		wantXID bool
	}{
		{17, false},
		{18, true},
	} {
		t.Run(fmt.Sprint(tc.version), func(t *testing.T) {
			t.Parallel()
			pool, table, p := at12(t, "outbox")
			ctx := context.Background()
			if _, err := p.UpTo(ctx, tc.version); err != nil {
				t.Fatal(err)
			}
			exec(t, pool,
				`INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('first', 'x')`,
				`CREATE FUNCTION "`+table.Schema+`".hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$`,
				`CREATE TRIGGER hold BEFORE INSERT ON `+table.Ident()+` FOR EACH ROW EXECUTE FUNCTION "`+table.Schema+`".hold()`)
			producer, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Release()
			pid := producer.Conn().PgConn().PID()
			inserted := make(chan error, 1)
			go func() {
				_, err := producer.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('held', 'x')`)
				inserted <- err
			}()
			var xid pgtype.Text
			testenv.Eventually(t, 10*time.Second, func() bool {
				var wait pgtype.Text
				err := pool.QueryRow(ctx, `SELECT wait_event, backend_xid::text FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&wait, &xid)
				return err == nil && wait.String == "PgSleep"
			}, "the insert did not reach its trigger")
			if xid.Valid != tc.wantXID {
				t.Errorf("at %d, the inserting transaction's id while its row's id is taken: %q (assigned %v), want assigned %v",
					tc.version, xid.String, xid.Valid, tc.wantXID)
			}
			if err := <-inserted; err != nil {
				t.Fatal(err)
			}
		})
	}
}
