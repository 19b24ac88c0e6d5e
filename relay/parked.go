package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// ParkedRow is a row parked for at least one target.
type ParkedRow struct {
	ID        int64              `json:"id"`
	MessageID string             `json:"message_id"`
	Topic     string             `json:"topic"`
	CreatedAt time.Time          `json:"created_at"`
	Targets   []ParkedTargetInfo `json:"targets"`
}

// ParkedTargetInfo says why a row is parked for one target.
type ParkedTargetInfo struct {
	Target   Target    `json:"target"`
	ParkedAt time.Time `json:"parked_at"`
	Attempts int       `json:"attempts"`
	Reason   string    `json:"reason"`
}

// ListParked returns up to limit rows parked for any of targets, oldest
// first. It reads through the parked index only.
func ListParked(ctx context.Context, db *pgxpool.Pool, table schema.Table, targets []Target, limit int) ([]ParkedRow, error) {
	return listParked(ctx, db, outboxsql.For(table).ListParked, targets, limit)
}

// ListParkedLast is ListParked, the highest ids first: the rows written
// last, which are not always the rows parked last.
func ListParkedLast(ctx context.Context, db *pgxpool.Pool, table schema.Table, targets []Target, limit int) ([]ParkedRow, error) {
	return listParked(ctx, db, outboxsql.For(table).ListParkedLast, targets, limit)
}

func listParked(ctx context.Context, db *pgxpool.Pool, sql string, targets []Target, limit int) ([]ParkedRow, error) {
	want := map[Target]bool{}
	for _, t := range targets {
		want[t] = true
	}
	rows, err := db.Query(ctx, sql, pgx.StrictStructArgs(outboxsql.ListParkedParams{AMQP: want[TargetAMQP], NATS: want[TargetNATS], Limit: limit}))
	if err != nil {
		return nil, fmt.Errorf("list parked: %w", err)
	}
	defer rows.Close()
	var out []ParkedRow
	for rows.Next() {
		var r ParkedRow
		var at [2]*time.Time
		var attempts [2]int
		var reason [2]string
		if err := rows.Scan(&r.ID, &r.MessageID, &r.Topic, &r.CreatedAt,
			&at[0], &attempts[0], &reason[0], &at[1], &attempts[1], &reason[1]); err != nil {
			return nil, fmt.Errorf("list parked: %w", err)
		}
		for i, t := range Targets {
			if at[i] != nil && want[t] {
				r.Targets = append(r.Targets, ParkedTargetInfo{Target: t, ParkedAt: *at[i], Attempts: attempts[i], Reason: reason[i]})
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ParkedRows says which parked rows RetryParked puts back: AllParked or
// ParkedIDs.
type ParkedRows struct {
	ids []int64
	all bool
}

// AllParked is every parked row.
func AllParked() ParkedRows { return ParkedRows{all: true} }

// ParkedIDs is the parked rows among ids.
func ParkedIDs(ids ...int64) ParkedRows { return ParkedRows{ids: ids} }

// RetryParked puts the parked rows that which selects back in line for
// the given targets. Attempts start again from 0, and a row no broker owes
// a publish of forgets its route (docs/routes.md, "Changing routes").
// Safe while relays run (a relay holding one of the rows makes the update
// wait for its batch); it wakes idle relays and sends every relay's owed
// floors back to the rows. It returns how many (row, target) pairs were
// put back.
func RetryParked(ctx context.Context, db *pgxpool.Pool, table schema.Table, targets []Target, which ParkedRows) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		low := int64(0)
		for _, t := range targets {
			var put, lowest int64
			if err := tx.QueryRow(ctx, outboxsql.For(table).RetryParked.Get(string(t)),
				pgx.StrictStructArgs(outboxsql.RetryParkedParams{All: which.all, IDs: which.ids})).Scan(&put, &lowest); err != nil {
				return err
			}
			n += put
			if lowest > 0 && (low == 0 || lowest < low) {
				low = lowest
			}
		}
		return notify(ctx, tx, table, low)
	})
	if err != nil {
		return 0, fmt.Errorf("retry parked: %w", err)
	}
	return n, nil
}
