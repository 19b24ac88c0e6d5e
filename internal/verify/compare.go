package verify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
)

// compare indexes the scanned pairs and runs the checks in SQL.
func (r *run) compare(ctx context.Context) error {
	sql := outboxsql.VerifyFor(r.cfg.Table)
	_, err := r.conn.Exec(ctx, sql.Index)
	if err != nil {
		return fmt.Errorf("index scanned ids: %w", err)
	}
	d := &r.rep.StreamDuplicates
	if err := r.conn.QueryRow(ctx, sql.Duplicates).Scan(&d.IDs, &d.Extra); err != nil {
		return fmt.Errorf("count duplicates: %w", err)
	}
	if d.Examples, err = r.duplicates(ctx, sql.DuplicateExamples); err != nil {
		return err
	}
	if err := r.check(ctx, sql.Outbox, &r.rep.Outbox); err != nil {
		return fmt.Errorf("check outbox: %w", err)
	}
	if err := r.check(ctx, sql.Backfill, &r.rep.Backfill); err != nil {
		return fmt.Errorf("check backfill: %w", err)
	}
	return nil
}

// check compares one ledger snapshot with the scanned pairs.
func (r *run) check(ctx context.Context, ledger outboxsql.VerifyLedger, c *Check) error {
	if c.Checked == 0 {
		return nil
	}
	if err := r.conn.QueryRow(ctx, ledger.Missing).Scan(&c.Missing); err != nil {
		return fmt.Errorf("count missing: %w", err)
	}
	if c.Missing > 0 && r.cfg.Examples > 0 {
		rows, err := r.conn.Query(ctx, ledger.MissingExamples, pgx.StrictStructArgs(outboxsql.ExamplesParams{Limit: r.cfg.Examples}))
		if err != nil {
			return fmt.Errorf("list missing: %w", err)
		}
		c.MissingExamples, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Missing, error) {
			var m Missing
			err := row.Scan(&m.ID, &m.At)
			return m, err
		})
		if err != nil {
			return fmt.Errorf("list missing: %w", err)
		}
	}
	if err := r.conn.QueryRow(ctx, ledger.Duplicated).Scan(&c.Duplicated); err != nil {
		return fmt.Errorf("count duplicated: %w", err)
	}
	if c.Duplicated > 0 {
		var err error
		c.DuplicatedExamples, err = r.duplicates(ctx, ledger.DuplicatedExamples)
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *run) duplicates(ctx context.Context, query string) ([]Duplicate, error) {
	out := []Duplicate{}
	if r.cfg.Examples == 0 {
		return out, nil
	}
	rows, err := r.conn.Query(ctx, query, pgx.StrictStructArgs(outboxsql.ExamplesParams{Limit: r.cfg.Examples}))
	if err != nil {
		return nil, fmt.Errorf("list duplicates: %w", err)
	}
	out, err = pgx.AppendRows(out, rows, func(row pgx.CollectableRow) (Duplicate, error) {
		var d Duplicate
		var seqs []int64
		if err := row.Scan(&d.ID, &d.Copies, &seqs); err != nil {
			return d, err
		}
		d.Seqs = make([]uint64, len(seqs))
		for i, s := range seqs {
			d.Seqs[i] = uint64(s)
		}
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list duplicates: %w", err)
	}
	return out, nil
}
