package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
const ExactLimit = 10000

// ReadStats reads each target's backlog. Every query is backed by the
// target's partial indexes of pending rows, unkeyed and keyed (or the parked
// index), so the cost does not grow with the backlog beyond ExactLimit index
// entries.
func ReadStats(ctx context.Context, db *pgxpool.Pool, table schema.Table, targets []Target) ([]TargetStats, error) {
	out := make([]TargetStats, 0, len(targets))
	tx, err := db.BeginTx(ctx, statsTx)
	if err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	for _, t := range targets {
		s, err := readTargetStats(ctx, tx, table, t)
		if err != nil {
			return nil, fmt.Errorf("read stats for %s: %w", t, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// statsTx keeps every stats query on its index: with seqscan off, the
// planner takes a sequential scan only where no index can answer. An outbox
// churns fast and is often far from its last ANALYZE — a table never
// analyzed is estimated from its size, every row assumed parked — and a
// sequential scan of a bloated outbox every RELAY_STATS_INTERVAL cost more
// than the relay's own claims (seen in the latency benchmark: half a
// second per read, a third of Postgres's CPU).
var statsTx = pgx.TxOptions{BeginQuery: "BEGIN READ ONLY; SET LOCAL enable_seqscan = off"}

// pendingFirst is SQL for the first n rows owed to target p, in id order,
// with the given columns: a merge of the target's two pending indexes
// (unkeyed rows and keyed rows are indexed apart, for the claims).
func pendingFirst(tbl, p, cols string, n int) string {
	pending := owed(p)
	return fmt.Sprintf(`(SELECT * FROM (
		(SELECT %[2]s FROM %[1]s WHERE key IS NULL AND %[3]s ORDER BY id LIMIT %[4]d)
		UNION ALL
		(SELECT %[2]s FROM %[1]s WHERE key IS NOT NULL AND %[3]s ORDER BY id LIMIT %[4]d)
	) u ORDER BY id LIMIT %[4]d)`, tbl, cols, pending, n)
}

// pendingLast is SQL for the highest id owed to target p (NULL if none).
func pendingLast(tbl, p string) string {
	pending := owed(p)
	return fmt.Sprintf(`greatest(
		(SELECT id FROM %[1]s WHERE key IS NULL AND %[2]s ORDER BY id DESC LIMIT 1),
		(SELECT id FROM %[1]s WHERE key IS NOT NULL AND %[2]s ORDER BY id DESC LIMIT 1))`, tbl, pending)
}

// statsQueries is the SQL readTargetStats runs for target t, in order:
// the pending window and lag, the parked rows and held keys, the last error.
func statsQueries(table schema.Table, t Target) [3]string {
	tbl, p := table.Ident(), string(t)
	return [3]string{
		fmt.Sprintf(`
WITH head AS %[1]s, first AS (
	SELECT id, topic, created_at FROM head ORDER BY created_at, id LIMIT 1
), win AS %[2]s
SELECT clock_timestamp(),
	(SELECT count(*) FROM win),
	(SELECT count(*) FROM win WHERE retry_at > now()),
	(SELECT min(id) FROM win),
	%[3]s,
	first.id, first.topic, first.created_at,
	extract(epoch FROM clock_timestamp() - first.created_at)::float8
FROM (SELECT 1) one LEFT JOIN first ON true`,
			pendingFirst(tbl, p, "id, topic, created_at", 100),
			pendingFirst(tbl, p, "id, "+p+"_retry_at AS retry_at", ExactLimit),
			pendingLast(tbl, p)),
		fmt.Sprintf(`SELECT count(*), count(DISTINCT key) FROM %[1]s
		WHERE (amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL) AND %[2]s_parked_at IS NOT NULL`, tbl, p),
		fmt.Sprintf(`SELECT last_error FROM (
		(SELECT id, last_error FROM %[3]s f)
		UNION ALL
		(SELECT id, %[2]s_last_error FROM %[1]s WHERE (amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL) AND %[2]s_parked_at IS NOT NULL)
	) r WHERE last_error IS NOT NULL ORDER BY id DESC LIMIT 1`, tbl, p, pendingFirst(tbl, p, "id, "+p+"_last_error AS last_error", ExactLimit)),
	}
}

func readTargetStats(ctx context.Context, tx pgx.Tx, table schema.Table, t Target) (TargetStats, error) {
	q := statsQueries(table, t)
	s := TargetStats{Target: t}
	var oldestID *int64
	var oldestTopic *string
	var oldestAt *time.Time
	var lagSec *float64
	var minID, maxID *int64
	err := tx.QueryRow(ctx, q[0]).
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
	err = tx.QueryRow(ctx, q[2]).Scan(&lastErr)
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
// JetStream: rows of an instance running without nats in RELAY_TARGETS —
// missed in the dual-write rollout, rolled back, or no instance in dual
// write yet. A row leaves once its own instance's targets have it, so such
// rows are never pending for nats and no backlog figure shows them.
//
// With since zero it looks back lookback, and counts only the rows after
// the first that reached JetStream there (or, none having reached it, all):
// legacy-only rows from before dual write came before it. It returns that
// first row's done_at (zero if none). With since set it counts every such
// row since then (lookback unused). It returns the database's time of the
// count too, for the next one's since.
//
// The count walks the record's rows in the window (its primary key is
// done_at first): its cost grows with the rows finished in it.
func FinishedWithoutNATS(ctx context.Context, db *pgxpool.Pool, table schema.Table, lookback time.Duration, since time.Time) (n int64, first, at time.Time, err error) {
	var f *time.Time
	if since.IsZero() {
		err = db.QueryRow(ctx, fmt.Sprintf(`WITH f AS (
	SELECT min(done_at) AS first FROM %[1]s WHERE done_at > now() - $1::interval AND nats_delivered_at IS NOT NULL)
SELECT count(*), now(), (SELECT first FROM f) FROM %[1]s
WHERE done_at > now() - $1::interval AND nats_delivered_at IS NULL
  AND done_at > coalesce((SELECT first FROM f), '-infinity')`, table.Delivered()),
			fmt.Sprintf("%d milliseconds", lookback.Milliseconds())).Scan(&n, &at, &f)
	} else {
		err = db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), now() FROM %s
WHERE done_at > $1 AND nats_delivered_at IS NULL`, table.Delivered()), since).Scan(&n, &at)
	}
	if f != nil {
		first = *f
	}
	return n, first, at, err
}
