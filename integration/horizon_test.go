package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// A transaction held open while producers commit at a steady rate (keyed
// rows and unkeyed) keeps every row relayd deletes meanwhile on disk. What
// relayd's claims read of the outbox per row relayed (heap and index
// blocks) must not grow with them: late in the hold it stays within 1.5
// times what it was early.
// Held: (a) a producer's transaction that inserted a row, whose row reaches
// both brokers within the poll interval of its commit; (b) a read-only
// REPEATABLE READ snapshot, as pg_dump holds. Every row arrives once.
func TestLongTransactionsDoNotSlowTheClaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold func(ctx context.Context, e *env, tx pgx.Tx) (msgID string)
	}{
		{"a producer's transaction", func(ctx context.Context, e *env, tx pgx.Tx) string {
			ids, err := e.writer.Write(ctx, tx, outbox.Message{Topic: "orders.held", Payload: []byte("held")})
			if err != nil {
				e.t.Fatal(err)
			}
			return ids[0]
		}},
		{"a REPEATABLE READ snapshot", func(ctx context.Context, e *env, tx pgx.Tx) string {
			if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err != nil {
				e.t.Fatal(err)
			}
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Ident()).Scan(&n); err != nil {
				e.t.Fatal(err)
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnvOwnDatabase(t)
			// Its scans would count as the claims' reads.
			if _, err := e.pool.Exec(ctx, `ALTER TABLE `+e.table.Ident()+` SET (autovacuum_enabled = false)`); err != nil {
				t.Fatal(err)
			}
			const poll = time.Second // relayd's default
			relayd := e.startRelay("relayd", fmt.Sprintf("RELAY_POLL_INTERVAL=%v", poll))

			// Producers: five rows every 20 ms, each five a transaction, so
			// that a claim takes about as many rows late as early whatever
			// the machine's load; every other row keyed.
			pctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for i := 0; ; i += 5 {
					select {
					case <-pctx.Done():
						return
					case <-tick.C:
					}
					msgs := make([]outbox.Message, 5)
					for j := range msgs {
						msgs[j] = outbox.Message{Topic: "orders.steady", Payload: []byte(fmt.Sprint(i + j))}
						if j%2 == 1 {
							msgs[j].Key = fmt.Sprint("k", (i+j)%50) // the keyed walks too
						}
					}
					if _, err := e.writer.Write(pctx, e.pool, msgs...); err != nil && pctx.Err() == nil {
						t.Error(err)
						return
					}
				}
			}()
			defer func() { stop(); wg.Wait() }()

			// reads is what the outbox's heap and indexes were read for so
			// far (the statistics flush at most once a second), and the rows
			// relayed.
			reads := func() (blocks, relayed int64) {
				t.Helper()
				if err := e.pool.QueryRow(ctx, `SELECT coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)
					+ coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)
					FROM pg_statio_user_tables WHERE relid = $1::regclass`, e.table.Ident()).Scan(&blocks); err != nil {
					t.Fatal(err)
				}
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Delivered()).Scan(&relayed); err != nil {
					t.Fatal(err)
				}
				return blocks, relayed
			}
			// byRelation is the same, split by heap and index, for the log.
			byRelation := func() map[string]int64 {
				t.Helper()
				rows, err := e.pool.Query(ctx, `SELECT 'heap', coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)
					FROM pg_statio_user_tables WHERE relid = $1::regclass
					UNION ALL SELECT indexrelname, idx_blks_hit + idx_blks_read
					FROM pg_statio_user_indexes WHERE relid = $1::regclass`, e.table.Ident())
				if err != nil {
					t.Fatal(err)
				}
				m := map[string]int64{}
				for rows.Next() {
					var name string
					var n int64
					if err := rows.Scan(&name, &n); err != nil {
						t.Fatal(err)
					}
					m[name] = n
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				return m
			}
			perRow := func(window time.Duration) float64 {
				t.Helper()
				b0, r0 := reads()
				m0 := byRelation()
				time.Sleep(window) // the window measured: pacing, not a wait for a result
				b1, r1 := reads()
				m1 := byRelation()
				if r1 == r0 {
					t.Fatal("no row relayed in the window")
				}
				var split []string
				for name, n := range m1 {
					split = append(split, fmt.Sprintf("%s %.1f", name, float64(n-m0[name])/float64(r1-r0)))
				}
				sort.Strings(split)
				t.Logf("%d rows relayed in %v; blocks per row: %s", r1-r0, window, strings.Join(split, ", "))
				return float64(b1-b0) / float64(r1-r0)
			}

			time.Sleep(2 * time.Second) // a steady rate first: pacing
			held, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Rollback(ctx) //nolint:errcheck // ended below
			heldMsg := tc.hold(ctx, e, held)
			time.Sleep(2 * time.Second) // rows deleted under the hold: pacing
			early := perRow(8 * time.Second)
			time.Sleep(12 * time.Second) // more of them: pacing
			late := perRow(8 * time.Second)
			var dead int64
			if err := e.pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`, e.table.Ident()).Scan(&dead); err != nil {
				t.Fatal(err)
			}
			t.Logf("outbox blocks read per row relayed: %.1f early in the hold, %.1f late, %d dead rows kept", early, late, dead)
			if late > 1.5*early+2 {
				t.Errorf("%.1f blocks read per row late in the hold, %.1f early: the claims' cost grows with the %d rows deleted meanwhile; relayd's warnings:\n%s",
					late, early, dead, warnings(relayd.out.String()))
			}

			if err := held.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if heldMsg != "" {
				at := time.Now()
				testenv.Eventually(t, 10*time.Second, func() bool {
					var ok bool
					e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+e.table.Delivered()+` WHERE message_id = $1::uuid)`, heldMsg).Scan(&ok) //nolint:errcheck // false until it is
					return ok
				}, "the held row never reached both brokers")
				if took := time.Since(at); took > poll {
					t.Errorf("the held transaction's row reached both brokers %v after its commit, want within the poll interval (%v)", took, poll)
				}
			}
			stop()
			wg.Wait()
			e.waitDelivered(60 * time.Second)
			e.checkExactlyOnce(e.committedIDs(), false)
		})
	}
}

// warnings is the lines of a relayd's log above INFO.
func warnings(log string) string {
	var out []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}
