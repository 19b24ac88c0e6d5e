package verify

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayd/relayd/internal/outboxsql"
)

// The run's temporary tables are in the session of the one connection it
// holds (outboxsql.VerifyRun).

func (r *run) createTables(ctx context.Context) error {
	r.dirty = true
	_, err := r.conn.Exec(ctx, outboxsql.VerifyFor(r.cfg.Table).Create)
	if err != nil {
		return fmt.Errorf("create temporary tables: %w", err)
	}
	return nil
}

// snapshotLedgers copies the window's ids from the owed table, the delivered
// table and the backfill record into temporary tables, server side.
func (r *run) snapshotLedgers(ctx context.Context) error {
	t := r.cfg.Table
	sql := outboxsql.VerifyFor(t)
	window := pgx.StrictStructArgs(outboxsql.VerifyParams{Since: r.cfg.Since, Until: r.cfg.Until})
	// An id a producer inserted again after its first row was delivered
	// counts once (outboxsql's VerifyOutbox).
	tag, err := r.conn.Exec(ctx, sql.FillOutbox, window)
	if isUndefinedTable(err) {
		return fmt.Errorf("%w: %s (run `relayd migrate`)", ErrNoTable, t)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", t, err)
	}
	r.rep.Outbox.Checked = tag.RowsAffected()

	tag, err = r.conn.Exec(ctx, sql.FillBackfill, window)
	if err != nil {
		return fmt.Errorf("read %s_backfilled: %w", t, err)
	}
	r.rep.Backfill.Checked = tag.RowsAffected()
	return nil
}

// isUndefinedTable reports a Postgres "relation does not exist".
func isUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}
