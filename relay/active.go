package relay

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/schema"
)

// activeWindow is how many rows of the outbox's head, and of the newest of
// its delivered record, ActiveTargets looks at: enough to see what the
// relays serve, few enough to stay cheap on a large table.
const activeWindow = 1000

// ActiveTargets returns the targets the outbox has rows for: those that a
// row was delivered to, tried for or parked for — in the outbox's oldest
// rows, the newest of its delivered record, or parked anywhere. With none
// yet (nothing relayed), every target: each row is owed to all of them.
func ActiveTargets(ctx context.Context, db *pgxpool.Pool, table schema.Table) ([]Target, error) {
	var amqp, nats bool
	err := db.QueryRow(ctx, fmt.Sprintf(activeTargetsSQL, table.Ident(), table.Delivered(), activeWindow)).Scan(&amqp, &nats)
	if err != nil {
		return nil, fmt.Errorf("read active targets: %w", err)
	}
	var out []Target
	if amqp {
		out = append(out, TargetAMQP)
	}
	if nats {
		out = append(out, TargetNATS)
	}
	if len(out) == 0 {
		return slices.Clone(Targets), nil
	}
	return out, nil
}

// activeTargetsSQL: %[1]s the outbox, %[2]s its delivered record, %[3]d
// activeWindow. The parked test is on the parked index's predicate.
const activeTargetsSQL = `
WITH head AS (SELECT amqp_delivered_at, amqp_attempts, nats_delivered_at, nats_attempts FROM %[1]s ORDER BY id LIMIT %[3]d),
rec AS (SELECT amqp_delivered_at, nats_delivered_at FROM %[2]s ORDER BY done_at DESC LIMIT %[3]d)
SELECT
	EXISTS (SELECT 1 FROM head WHERE amqp_delivered_at IS NOT NULL OR amqp_attempts > 0)
	OR EXISTS (SELECT 1 FROM rec WHERE amqp_delivered_at IS NOT NULL)
	OR EXISTS (SELECT 1 FROM %[1]s WHERE (amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL) AND amqp_parked_at IS NOT NULL),
	EXISTS (SELECT 1 FROM head WHERE nats_delivered_at IS NOT NULL OR nats_attempts > 0)
	OR EXISTS (SELECT 1 FROM rec WHERE nats_delivered_at IS NOT NULL)
	OR EXISTS (SELECT 1 FROM %[1]s WHERE (amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL) AND nats_parked_at IS NOT NULL)`
