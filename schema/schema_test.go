package schema_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

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

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, insert); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { _, err := p.Up(ctx); migrated <- err }()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'
			AND query LIKE '%DROP CONSTRAINT IF EXISTS%' AND strpos(query, $1) > 0`, table.Schema).Scan(&n)
		return n == 1
	}, "the migration did not start")
	for range 3 {
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := pool.Exec(ictx, insert)
		cancel()
		if err != nil {
			t.Fatalf("a producer's insert while the migration waits: %v", err)
		}
	}
	select {
	case err := <-migrated:
		t.Fatalf("the migration ended while a transaction held the outbox: %v", err)
	default:
	}
	if n := checks(); n != 2 {
		t.Fatalf("%d CHECKs while the migration waits, want 2", n)
	}

	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-migrated:
		if err != nil {
			t.Fatalf("migrate after the transaction ended: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the migration did not end 30 s after the transaction holding the outbox")
	}
	if n := checks(); n != 0 {
		t.Fatalf("%d CHECKs after 00012, want 0", n)
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
