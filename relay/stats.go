package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// TargetStats is how far one target is behind, read from the outbox table.
type TargetStats struct {
	Target Target `json:"target"`
	// Pending is the number of rows still owed to the target (not
	// delivered, not parked). Exact up to ExactLimit; above it an estimate
	// from the pending id range (an upper bound), with PendingExact false.
	Pending      int64 `json:"pending"`
	PendingExact bool  `json:"pending_exact"`
	// Lag is the age, by the database clock, of the oldest pending row (of
	// the first 100 by id); 0 when nothing is pending.
	Lag        time.Duration `json:"-"`
	LagSeconds float64       `json:"lag_seconds"`
	// Oldest pending row, when Pending > 0.
	OldestID    int64     `json:"oldest_id,omitempty"`
	OldestTopic string    `json:"oldest_topic,omitempty"`
	OldestAt    time.Time `json:"oldest_created_at,omitzero"`
	// Retrying is how many of the first ExactLimit pending rows wait for a
	// retry after a failed publish.
	Retrying int64 `json:"retrying"`
	// Parked rows will not be retried without an operator.
	Parked int64 `json:"parked"`
	// HeldKeys is how many keys have a parked row for the target: their
	// later rows wait for it (unless SkipParkedKeys).
	HeldKeys int64 `json:"held_keys"`
	// LastError is the last_error of the newest unfinished row that has one.
	LastError string `json:"last_error,omitempty"`
	// At is when the figures were read (database clock).
	At time.Time `json:"at"`
}

// ExactLimit is how many pending rows are counted one by one; beyond it
// the count is estimated, so that reading stats stays cheap with millions of
// rows pending.
const ExactLimit = outboxsql.ExactLimit

// ReadStats reads each target's backlog. Every query is backed by the
// target's partial indexes of pending rows, unkeyed and keyed (or the parked
// index), so the cost does not grow with the backlog beyond ExactLimit index
// entries.
func ReadStats(ctx context.Context, db *pgxpool.Pool, table schema.Table, targets []Target) ([]TargetStats, error) {
	return readStats(ctx, db, table, targets, outboxsql.StatsParams{})
}

// Stats is ReadStats of the targets the relay runs, read from its floors:
// the rows below them that no batch holds are deleted ones a long
// transaction keeps on disk, which a read from the oldest would walk.
func (r *Relay) Stats(ctx context.Context) ([]TargetStats, error) {
	return readStats(ctx, r.pool, r.cfg.Table, r.Phase().Running, r.floor.statsFloors())
}

func readStats(ctx context.Context, db *pgxpool.Pool, table schema.Table, targets []Target, from outboxsql.StatsParams) ([]TargetStats, error) {
	out := make([]TargetStats, 0, len(targets))
	tx, err := db.BeginTx(ctx, statsTx)
	if err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	for _, t := range targets {
		s, err := readTargetStats(ctx, tx, table, t, from)
		if err != nil {
			return nil, fmt.Errorf("read stats for %s: %w", t, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// statsTx keeps every stats query on its index: an outbox churns fast and
// is often far from its last ANALYZE, and the planner would otherwise scan
// the whole table where an index answers.
var statsTx = pgx.TxOptions{BeginQuery: strings.Join(outboxsql.ReadBegin, "; ")}

// statsQueries is the SQL readTargetStats runs for target t, in order:
// the pending window and lag, the parked rows and held keys, the last error.
func statsQueries(table schema.Table, t Target) [3]string {
	q := outboxsql.For(table).Stats.Get(string(t))
	return [3]string{q.Pending, q.Parked, q.LastError}
}

func readTargetStats(ctx context.Context, tx pgx.Tx, table schema.Table, t Target, from outboxsql.StatsParams) (TargetStats, error) {
	q := statsQueries(table, t)
	s := TargetStats{Target: t}
	var oldestID *int64
	var oldestTopic *string
	var oldestAt *time.Time
	var lagSec *float64
	var minID, maxID *int64
	floor := pgx.StrictStructArgs(from)
	err := tx.QueryRow(ctx, q[0], floor).
		Scan(&s.At, &s.Pending, &s.Retrying, &minID, &maxID, &oldestID, &oldestTopic, &oldestAt, &lagSec)
	if err != nil {
		return s, err
	}
	s.PendingExact = s.Pending < ExactLimit
	if !s.PendingExact && minID != nil && maxID != nil {
		s.Pending = max(s.Pending, *maxID-*minID+1)
	}
	if oldestID != nil {
		s.OldestID, s.OldestTopic, s.OldestAt = *oldestID, *oldestTopic, *oldestAt
		s.Lag = max(0, time.Duration(*lagSec*float64(time.Second)))
		s.LagSeconds = s.Lag.Seconds()
	}
	if err := tx.QueryRow(ctx, q[1]).Scan(&s.Parked, &s.HeldKeys); err != nil {
		return s, err
	}
	var lastErr *string
	err = tx.QueryRow(ctx, q[2], floor).Scan(&lastErr)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return s, err
	}
	if lastErr != nil {
		s.LastError = *lastErr
	}
	return s, nil
}

// DualWriteLookback is how far back the cutover check looks for rows
// finished without JetStream (FinishedWithoutNATS).
const DualWriteLookback = 15 * time.Minute

// FinishedWithoutNATS counts the rows that left the outbox without
// JetStream: rows of an instance without nats in RELAY_TARGETS. They are
// never pending for nats, so no backlog figure shows them.
//
// With since zero it looks back lookback and counts only the rows after the
// first that reached JetStream there (all, if none did), returning that
// row's done_at as first; with since set, every such row since then. at is
// the database's time of the count: the next call's since.
func FinishedWithoutNATS(ctx context.Context, db *pgxpool.Pool, table schema.Table, lookback time.Duration, since time.Time) (n int64, first, at time.Time, err error) {
	sql := outboxsql.For(table)
	var f *time.Time
	if since.IsZero() {
		p := outboxsql.FinishedWithoutNATSParams{Lookback: fmt.Sprintf("%d milliseconds", lookback.Milliseconds())}
		err = db.QueryRow(ctx, sql.FinishedWithoutNATS, pgx.StrictStructArgs(p)).Scan(&n, &at, &f)
	} else {
		err = db.QueryRow(ctx, sql.FinishedWithoutNATSSince, pgx.StrictStructArgs(outboxsql.FinishedWithoutNATSSinceParams{Since: since})).Scan(&n, &at)
	}
	if f != nil {
		first = *f
	}
	return n, first, at, err
}
