package integration

import (
	"context"
	"fmt"
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
			e.startRelay("relayd", fmt.Sprintf("RELAY_POLL_INTERVAL=%v", poll))

			// Producers: a row every 4 ms, each its own transaction, every
			// other one keyed.
			pctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(4 * time.Millisecond)
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-pctx.Done():
						return
					case <-tick.C:
					}
					msg := outbox.Message{Topic: "orders.steady", Payload: []byte(fmt.Sprint(i))}
					if i%2 == 1 {
						msg.Key = fmt.Sprint("k", i%50) // the keyed walks too
					}
					if _, err := e.writer.Write(pctx, e.pool, msg); err != nil && pctx.Err() == nil {
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
			perRow := func(window time.Duration) float64 {
				t.Helper()
				b0, r0 := reads()
				time.Sleep(window) // the window measured: pacing, not a wait for a result
				b1, r1 := reads()
				if r1 == r0 {
					t.Fatal("no row relayed in the window")
				}
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
			early := perRow(5 * time.Second)
			time.Sleep(15 * time.Second) // more of them: pacing
			late := perRow(5 * time.Second)
			var dead int64
			if err := e.pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`, e.table.Ident()).Scan(&dead); err != nil {
				t.Fatal(err)
			}
			t.Logf("outbox blocks read per row relayed: %.1f early in the hold, %.1f late, %d dead rows kept", early, late, dead)
			if late > 1.5*early+2 {
				t.Errorf("%.1f blocks read per row late in the hold, %.1f early: the claims' cost grows with the %d rows deleted meanwhile", late, early, dead)
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
