package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/testenv"
)

// Every goroutine the tests start (consumers, connections, RunCleanup) must
// be gone when they end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check outlives a closed pool briefly.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// fixture is one test's inbox table, in a schema of its own, and a side
// table where handlers record their effects.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	table  string // "<schema>.inbox", as Config.Table takes it
	side   string // quoted "<schema>"."side"
}

func setup(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.Pool(t)
	f := &fixture{t: t, pool: pool, schema: testenv.Name("inbox")}
	f.table = f.schema + ".inbox"
	f.side = `"` + f.schema + `".side`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := inbox.Migrate(ctx, db, f.table); err != nil {
		t.Fatalf("migrate %s: %v", f.table, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA "`+f.schema+`" CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", f.schema, err)
		}
	})
	f.exec(`CREATE TABLE ` + f.side + ` (message_id text NOT NULL, source text NOT NULL, instance text NOT NULL)`)
	return f
}

func (f *fixture) exec(q string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), q, args...); err != nil {
		f.t.Fatalf("%s: %v", q, err)
	}
}

// newInbox returns an Inbox on the fixture's table.
func (f *fixture) newInbox(cfg inbox.Config) *inbox.Inbox {
	f.t.Helper()
	cfg.Table = f.table
	in, err := inbox.New(f.pool, cfg)
	if err != nil {
		f.t.Fatalf("inbox.New: %v", err)
	}
	return in
}

// effect returns a handler that records one side-effect row per call in the
// handler's transaction, and counts its calls.
func (f *fixture) effect(instance string, calls *atomic.Int64) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO `+f.side+` (message_id, source, instance) VALUES ($1, $2, $3)`, m.ID, m.Source, instance)
		return err
	}
}

// sideCounts returns how many side-effect rows each message id has.
func (f *fixture) sideCounts() map[string]int {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT message_id, count(*) FROM `+f.side+` GROUP BY message_id`)
	if err != nil {
		f.t.Fatal(err)
	}
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		n  int
	}, error) {
		var v struct {
			id string
			n  int
		}
		return v, r.Scan(&v.id, &v.n)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	out := make(map[string]int, len(counts))
	for _, c := range counts {
		out[c.id] = c.n
	}
	return out
}

// inboxRows returns how many ids the inbox holds for consumer.
func (f *fixture) inboxRows(consumer string) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.table+` WHERE consumer = $1`, consumer).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// checkOnce fails unless every id in ids has exactly one side effect and
// nothing else has any.
func (f *fixture) checkOnce(ids []string) {
	f.t.Helper()
	counts := f.sideCounts()
	bad := 0
	for _, id := range ids {
		if n := counts[id]; n != 1 {
			if bad < 5 {
				f.t.Errorf("message %s: %d side effects, want exactly 1", id, n)
			}
			bad++
		}
	}
	if len(counts) != len(ids) {
		f.t.Errorf("side effects for %d distinct ids, want %d", len(counts), len(ids))
	}
	if bad > 0 {
		f.t.Errorf("%d of %d messages not processed exactly once", bad, len(ids))
	}
}

// counter reads one labelled counter from reg (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name, source string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" && l.GetValue() == source {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// uuids returns n random version-4 UUIDs in canonical lower-case form, as
// relayd writes them.
func uuids(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		var u [16]byte
		rand.Read(u[:])
		u[6] = u[6]&0x0f | 0x40
		u[8] = u[8]&0x3f | 0x80
		h := hex.EncodeToString(u[:])
		ids[i] = h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	}
	return ids
}
