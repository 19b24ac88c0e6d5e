package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
)

// batchSlack is what a relay's batch may take past its publish timeout
// (relay.runBatch: the publish timeout and 30 s for the record), and a little.
const batchSlack = 35 * time.Second

// awaitClaims waits for the batches the relays hold now to end. One claimed
// in the nats-only phase before its relay switched finishes its rows on
// JetStream only: read before that, its message is past the window's last
// sequence, or its row still looks owed (in the outbox or the owed table).
// After PublishTimeout and batchSlack it warns and goes on.
func (r *runner) awaitClaims(ctx context.Context) error {
	var open []string
	if err := r.cfg.DB.QueryRow(ctx, r.rec.q.ReplayClaims).Scan(&open); err != nil {
		return fmt.Errorf("read the relays' batches in flight: %w", err)
	}
	if len(open) == 0 {
		return nil
	}
	r.log.Info("replay: waiting for the relays' batches in flight to finish", "batches", len(open))
	deadline := time.Now().Add(r.cfg.PublishTimeout + batchSlack)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var left int
		if err := r.cfg.DB.QueryRow(ctx, r.rec.q.ReplayClaimsLeft, pgx.StrictStructArgs(outboxsql.ReplayClaimsLeftParams{Transactions: open})).Scan(&left); err != nil {
			return fmt.Errorf("read the relays' batches in flight: %w", err)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			r.log.Warn("replay: transactions holding outbox rows since before the run are still open: if a relay claimed them in the nats-only phase, rerun once they end",
				"transactions", left)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
