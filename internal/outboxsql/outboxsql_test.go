package outboxsql

import (
	"context"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

// Every statement parses, resolves against a migrated table and plans: a
// typo in a template or a column fails here, not in the relay.
func TestStatementsPrepareAndPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	all := For(table).All()
	if len(all) < 20 {
		t.Fatalf("found %d statements, want every field of Statements", len(all))
	}
	for name, sql := range all {
		if sql == "" || strings.Contains(sql, "<no value>") {
			t.Errorf("%s rendered as %q", name, sql)
			continue
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range BatchBegin[1:] {
			if _, err := tx.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, "PREPARE s AS "+sql); err != nil {
			t.Errorf("%s: prepare: %v\n%s", name, err, sql)
			tx.Rollback(ctx) //nolint:errcheck // failing anyway
			continue
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = 's'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		args := strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ")
		explain := "EXPLAIN EXECUTE s"
		if n > 0 {
			explain += "(" + args + ")"
		}
		if _, err := tx.Exec(ctx, explain); err != nil {
			t.Errorf("%s: %s: %v", name, explain, err)
		}
		tx.Exec(ctx, "DEALLOCATE s") //nolint:errcheck // rolled back next
		tx.Rollback(ctx)             //nolint:errcheck // nothing to keep
	}
}

// The statements are rendered for the table they are asked for, and only the
// quoted identifiers vary between tables.
func TestForRendersEachTable(t *testing.T) {
	t.Parallel()
	a, b := For(schema.MustParseTable("outbox")), For(schema.MustParseTable("s1.box"))
	if For(schema.MustParseTable("outbox")) != a {
		t.Error("For rendered the same table twice")
	}
	if !strings.Contains(a.Claim, `FROM "outbox" WHERE`) || !strings.Contains(b.Claim, `FROM "s1"."box" WHERE`) {
		t.Errorf("claim not rendered for its table:\n%s", b.Claim)
	}
	if !strings.Contains(b.Record, `INSERT INTO "s1"."box_delivered"`) || !strings.Contains(b.CleanupBackfilled, `"s1"."box_backfilled"`) {
		t.Error("side tables not rendered for their table")
	}
	sa, sb := a.All(), b.All()
	for name, q := range sa {
		if strings.ReplaceAll(q, `"outbox`, `"s1"."box`) != sb[name] {
			t.Errorf("%s differs between tables beyond the identifiers", name)
		}
	}
}
