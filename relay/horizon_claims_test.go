package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/testenv"
)

// A transaction held open while producers commit at a steady rate keeps
// every row the relay deletes meanwhile on disk. What a claim reads of the
// outbox (heap and index blocks, per claim) must not grow with them: late
// in the hold it stays within 1.5 times what it was early (a walk from a
// floor held back by the transaction, or from the oldest row, grows with
// every row deleted since). Held: (a) a producer's transaction that inserted
// a row, whose row arrives within the poll interval of its commit; (b) a
// read-only REPEATABLE READ snapshot, as pg_dump holds. Every row arrives
// once.
func TestLongTransactionsDoNotSlowTheClaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold func(ctx context.Context, tx pgx.Tx, f *fixture) (msgID string)
	}{
		{"a producer's transaction", func(ctx context.Context, tx pgx.Tx, f *fixture) string {
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.held', '\x00')
				RETURNING message_id::text`).Scan(&id); err != nil {
				f.t.Fatal(err)
			}
			return id
		}},
		{"a REPEATABLE READ snapshot", func(ctx context.Context, tx pgx.Tx, f *fixture) string {
			if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err != nil {
				f.t.Fatal(err)
			}
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+f.table.Ident()).Scan(&n); err != nil {
				f.t.Fatal(err)
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setupOwnDatabase(t)
			f.noAutovacuum() // its scans would count as the claims' reads
			a, n := newFake(TargetAMQP), newFake(TargetNATS)
			var claims atomic.Int64
			const poll = time.Second
			f.startWith(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: poll}, func(r *Relay) {
				r.hooks = &testHooks{claimed: func(int, int64) { claims.Add(1) }}
			})

			// Producers: a row every 4 ms, each its own transaction.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			var committed []string
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(4 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					ids := f.insert(1, "orders.created")
					mu.Lock()
					committed = append(committed, ids...)
					mu.Unlock()
				}
			}()
			defer func() {
				select {
				case <-stop:
				default:
					close(stop)
				}
				wg.Wait()
			}()

			// reads is what the outbox's heap and indexes were read for so
			// far (the statistics flush at most once a second), and claims.
			reads := func() (blocks, claimed int64) {
				t.Helper()
				if err := f.pool.QueryRow(ctx, `SELECT coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)
					+ coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)
					FROM pg_statio_user_tables WHERE relid = $1::regclass`, f.table.Ident()).Scan(&blocks); err != nil {
					t.Fatal(err)
				}
				return blocks, claims.Load()
			}
			perClaim := func(window time.Duration) float64 {
				t.Helper()
				b0, c0 := reads()
				time.Sleep(window) // the window measured: pacing, not a wait for a result
				b1, c1 := reads()
				if c1 == c0 {
					t.Fatal("no claim in the window")
				}
				return float64(b1-b0) / float64(c1-c0)
			}

			time.Sleep(2 * time.Second) // a steady rate first: pacing
			held, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Rollback(ctx) //nolint:errcheck // ended below
			heldMsg := tc.hold(ctx, held, f)
			time.Sleep(2 * time.Second) // rows deleted under the hold: pacing
			early := perClaim(5 * time.Second)
			time.Sleep(15 * time.Second) // more of them: pacing
			late := perClaim(5 * time.Second)
			var dead int64
			if err := f.pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`, f.table.Ident()).Scan(&dead); err != nil {
				t.Fatal(err)
			}
			t.Logf("outbox blocks read per claim: %.1f early in the hold, %.1f late, %d dead rows kept", early, late, dead)
			if late > 1.5*early+2 {
				t.Errorf("a claim reads %.1f blocks late in the hold, %.1f early: it grows with the %d rows deleted meanwhile", late, early, dead)
			}

			if err := held.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if heldMsg != "" {
				at := time.Now()
				testenv.Eventually(t, 10*time.Second, func() bool { got, _ := n.count(heldMsg); return got == 1 }, "the held row never arrived")
				if took := time.Since(at); took > poll {
					t.Errorf("the held transaction's row arrived %v after its commit, want within the poll interval (%v)", took, poll)
				}
				mu.Lock()
				committed = append(committed, heldMsg)
				mu.Unlock()
			}
			close(stop)
			wg.Wait()
			testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(committed) }, "rows not all done")
			for _, id := range committed {
				ga, _ := a.count(id)
				gn, _ := n.count(id)
				if ga != 1 || gn != 1 {
					t.Fatalf("row %s: amqp got it %d times, nats %d; want once each", id, ga, gn)
				}
			}
		})
	}
}
