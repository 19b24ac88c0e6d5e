// Package pghealth reads what the database does to relayd's tables: what
// holds back VACUUM's horizon, and the row versions VACUUM has not removed
// yet. Status, the console and the metrics read it; the relay does not.
package pghealth

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// Holder is what holds back VACUUM's horizon in the database: while
// it runs, no row version deleted after it began can be removed, relayd's
// tables among them (docs/operations.md, "Long transactions").
type Holder struct {
	// Kind is "transaction" (it writes: it has a transaction id), "snapshot"
	// (it only reads: pg_dump, a long query), "standby" (a standby's
	// hot_standby_feedback), "prepared" or "replication slot".
	Kind string `json:"kind"`
	PID  int32  `json:"pid,omitempty"` // sessions and standbys only
	// Name is the session's application_name (else its backend type), the
	// prepared transaction's gid or the slot's name.
	Name  string `json:"name"`
	State string `json:"state"` // the session's: "active", "idle in transaction"…
	// Horizon is the transaction id it holds the horizon at; XIDs how many
	// transaction ids old that is.
	Horizon string `json:"horizon_xid"`
	XIDs    int64  `json:"xids"`
	// Age is how long it has run (since its transaction began, or was
	// prepared); unknown (AgeKnown false) for a standby, a slot, and another
	// user's session unless relayd's role has pg_read_all_stats.
	Age        time.Duration `json:"-"`
	AgeSeconds float64       `json:"age_seconds,omitempty"`
	AgeKnown   bool          `json:"age_known"`
}

// Table is one of relayd's tables: the row versions VACUUM has not
// removed yet, and its size.
type Table struct {
	Table      string `json:"table"` // "outbox", "owed" or "delivered"
	DeadTuples int64  `json:"dead_tuples"`
	LiveTuples int64  `json:"live_tuples"`
	Bytes      int64  `json:"bytes"` // with its indexes and TOAST
}

// Health is what the database does to relayd's tables.
type Health struct {
	Horizon []Holder `json:"horizon"` // the oldest of each kind, the oldest first
	Tables  []Table  `json:"tables"`
}

// Oldest is the holder whose horizon is the oldest; ok is false when none
// holds one.
func (h Health) Oldest() (Holder, bool) {
	if len(h.Horizon) == 0 {
		return Holder{}, false
	}
	return h.Horizon[0], true
}

// Read reads the holders of the horizon and relayd's tables'
// figures, from catalog views: its cost does not depend on the tables.
func Read(ctx context.Context, db *pgxpool.Pool, table schema.Table) (Health, error) {
	sql := outboxsql.For(table)
	var h Health
	rows, err := db.Query(ctx, sql.Horizon)
	if err != nil {
		return h, fmt.Errorf("read the horizon: %w", err)
	}
	for rows.Next() {
		var x Holder
		var pid *int32
		var seconds *float64
		if err := rows.Scan(&x.Kind, &pid, &x.Name, &x.State, &x.Horizon, &x.XIDs, &seconds); err != nil {
			rows.Close()
			return h, fmt.Errorf("read the horizon: %w", err)
		}
		if pid != nil {
			x.PID = *pid
		}
		if seconds != nil {
			x.Age, x.AgeSeconds, x.AgeKnown = time.Duration(*seconds*float64(time.Second)), *seconds, true
		}
		h.Horizon = append(h.Horizon, x)
	}
	if err := rows.Err(); err != nil {
		return h, fmt.Errorf("read the horizon: %w", err)
	}
	// The same horizon (a snapshot taken while a writer ran): the longer held first.
	slices.SortStableFunc(h.Horizon, func(a, b Holder) int { return cmp.Or(cmp.Compare(b.XIDs, a.XIDs), cmp.Compare(b.Age, a.Age)) })
	rows, err = db.Query(ctx, sql.TableHealth)
	if err != nil {
		return h, fmt.Errorf("read table health: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t Table
		if err := rows.Scan(&t.Table, &t.DeadTuples, &t.LiveTuples, &t.Bytes); err != nil {
			return h, fmt.Errorf("read table health: %w", err)
		}
		h.Tables = append(h.Tables, t)
	}
	return h, rows.Err()
}
