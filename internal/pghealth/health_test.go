package pghealth_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/pghealth"
	"github.com/relayd/relayd/internal/testenv"
)

// What holds back VACUUM's horizon, in a database of the test's own: a
// transaction that inserted an outbox row and stays open, a REPEATABLE READ
// snapshot as pg_dump holds; each is read with its session and state, and
// the rows deleted meanwhile show as the outbox's dead rows.
func TestReadPostgresNamesWhatHoldsTheHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.Database(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := testenv.Outbox(t, pool)
	h, err := pghealth.Read(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	if x, ok := h.Oldest(); ok {
		t.Fatalf("the horizon is held by %+v before the test holds it", x)
	}

	writer, reader := testenv.Session(t, url, "horizon-writer"), testenv.Session(t, url, "horizon-reader")
	if _, err := writer.Exec(ctx, `BEGIN; INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('held', 'x')`); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT count(*) FROM pg_class`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) SELECT 'gone', 'x' FROM generate_series(1, 500)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+table.Ident()+` WHERE topic = 'gone'; SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}

	var tables map[string]pghealth.Table
	testenv.Eventually(t, 10*time.Second, func() bool {
		if h, err = pghealth.Read(ctx, pool, table); err != nil {
			t.Fatal(err)
		}
		tables = map[string]pghealth.Table{}
		for _, x := range h.Tables {
			tables[x.Table] = x
		}
		return tables["outbox"].DeadTuples >= 500
	}, "the outbox's dead rows: %+v, want at least the 500 deleted", lazyTables{&h})
	for _, name := range []string{"outbox", "owed", "delivered"} {
		if tables[name].Bytes <= 0 {
			t.Errorf("table %s: %+v, want its size", name, tables[name])
		}
	}
	byKind := map[string]pghealth.Holder{}
	for _, x := range h.Horizon {
		byKind[x.Kind] = x
	}
	for _, want := range []struct{ kind, name, state string }{
		{"transaction", "horizon-writer", "idle in transaction"},
		{"snapshot", "horizon-reader", "idle in transaction"},
	} {
		x := byKind[want.kind]
		if x.Name != want.name || x.State != want.state || x.PID == 0 || !x.AgeKnown || x.Age <= 0 {
			t.Errorf("%s: %+v, want %s, %s, with its pid and age", want.kind, x, want.name, want.state)
		}
	}
	// The oldest: the snapshot's horizon may be a transaction of another
	// database's (xmin is the cluster's), older than the writer's own.
	for _, x := range h.Horizon {
		if oldest, _ := h.Oldest(); x.XIDs > oldest.XIDs {
			t.Errorf("the oldest holder is %+v, but %+v holds an older horizon", oldest, x)
		}
	}
}

// lazyTables prints the tables' figures when a wait fails.
type lazyTables struct{ h *pghealth.Health }

func (l lazyTables) String() string { return fmt.Sprintf("%+v", l.h.Tables) }
