package relay

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// ActiveTargets returns the targets the outbox has rows for: those that a
// row was delivered to, tried for or parked for — in the outbox's oldest
// rows, the newest of its delivered record, or parked anywhere. With none
// yet (nothing relayed), every target: each row is owed to all of them.
func ActiveTargets(ctx context.Context, db *pgxpool.Pool, table schema.Table) ([]Target, error) {
	var amqp, nats bool
	err := db.QueryRow(ctx, outboxsql.For(table).ActiveTargets).Scan(&amqp, &nats)
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
