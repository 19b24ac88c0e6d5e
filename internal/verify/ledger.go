package verify

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayd/relayd/internal/outboxsql"
)

// Temporary tables, in the session of the one connection a run holds.
const (
	tmpStream   = "pg_temp.relayd_verify_stream"
	tmpOutbox   = "pg_temp.relayd_verify_outbox"
	tmpBackfill = "pg_temp.relayd_verify_backfill"
	tmpDups     = "pg_temp.relayd_verify_dups"
)

func (r *run) createTables(ctx context.Context) error {
	r.dirty = true
	_, err := r.conn.Exec(ctx, `
DROP TABLE IF EXISTS `+tmpStream+`, `+tmpOutbox+`, `+tmpBackfill+`, `+tmpDups+`;
CREATE TEMP TABLE `+tmpStream+` (msg_id text NOT NULL, seq bigint NOT NULL);
CREATE TEMP TABLE `+tmpOutbox+` (msg_id text NOT NULL, at timestamptz NOT NULL);
CREATE TEMP TABLE `+tmpBackfill+` (msg_id text NOT NULL, at timestamptz NOT NULL)`)
	if err != nil {
		return fmt.Errorf("create temporary tables: %w", err)
	}
	return nil
}

// snapshotLedgers copies the window's ids from the owed table, the delivered
// table and the backfill record into temporary tables, server side.
func (r *run) snapshotLedgers(ctx context.Context) error {
	t := r.cfg.Table
	sql := outboxsql.For(t)
	// An id a producer inserted again after its first row was delivered
	// counts once (outboxsql's VerifyOutbox).
	tag, err := r.conn.Exec(ctx, `INSERT INTO `+tmpOutbox+` (msg_id, at) `+sql.VerifyOutbox, r.cfg.Since, r.cfg.Until)
	if isUndefinedTable(err) {
		return fmt.Errorf("%w: %s (run `relayd migrate`)", ErrNoTable, t)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", t, err)
	}
	r.rep.Outbox.Checked = tag.RowsAffected()

	var exists bool
	if err := r.conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.Backfilled()).Scan(&exists); err != nil {
		return fmt.Errorf("look for %s_backfilled: %w", t, err)
	}
	if !exists {
		r.rep.Backfill.Skipped = fmt.Sprintf("no table %s_backfilled: run `relayd migrate`", t)
		return nil
	}
	tag, err = r.conn.Exec(ctx, `INSERT INTO `+tmpBackfill+` (msg_id, at) `+sql.VerifyBackfill, r.cfg.Since, r.cfg.Until)
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
