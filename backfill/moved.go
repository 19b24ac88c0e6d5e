package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// Moved is what backfill runs moved from one legacy queue lately, as
// <table>_backfilled records it: how many ids, the first and the last move.
type Moved struct {
	Queue       string
	Count       int64
	First, Last time.Time
}

// RecentlyMoved reads, per queue, what was moved within the last window:
// the pace of a running backfill, which reports nothing else to Postgres.
// The moved_at index bounds the read to the window's rows.
func RecentlyMoved(ctx context.Context, db *pgxpool.Pool, table schema.Table, window time.Duration) ([]Moved, error) {
	rows, err := db.Query(ctx, outboxsql.For(table).BackfillMoved, pgx.StrictStructArgs(outboxsql.BackfillMovedParams{WindowMS: window.Milliseconds()}))
	if err != nil {
		return nil, fmt.Errorf("read the backfill's moves: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Moved, error) {
		var m Moved
		err := r.Scan(&m.Queue, &m.Count, &m.First, &m.Last)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the backfill's moves: %w", err)
	}
	return out, nil
}
