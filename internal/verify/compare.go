package verify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// maxSeqs bounds the sequences listed for one duplicated id.
const maxSeqs = 20

// compare indexes the scanned pairs and runs the checks in SQL.
func (r *run) compare(ctx context.Context) error {
	_, err := r.conn.Exec(ctx, `
CREATE INDEX ON `+tmpStream+` (msg_id);
ANALYZE `+tmpStream+`;
ANALYZE `+tmpOutbox+`;
ANALYZE `+tmpBackfill+`;
CREATE TEMP TABLE `+tmpDups+` AS
	SELECT msg_id, count(*) AS copies, (array_agg(seq ORDER BY seq))[1:`+fmt.Sprint(maxSeqs)+`] AS seqs, min(seq) AS first_seq
	FROM `+tmpStream+` GROUP BY msg_id HAVING count(*) > 1;
ANALYZE `+tmpDups+`;`)
	if err != nil {
		return fmt.Errorf("index scanned ids: %w", err)
	}
	d := &r.rep.StreamDuplicates
	if err := r.conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(copies - 1), 0) FROM `+tmpDups).Scan(&d.IDs, &d.Extra); err != nil {
		return fmt.Errorf("count duplicates: %w", err)
	}
	if d.Examples, err = r.duplicates(ctx, `SELECT msg_id, copies, seqs FROM `+tmpDups+` ORDER BY first_seq LIMIT $1`); err != nil {
		return err
	}
	if err := r.check(ctx, tmpOutbox, &r.rep.Outbox); err != nil {
		return fmt.Errorf("check outbox: %w", err)
	}
	if r.rep.Backfill.Skipped == "" {
		if err := r.check(ctx, tmpBackfill, &r.rep.Backfill); err != nil {
			return fmt.Errorf("check backfill: %w", err)
		}
	}
	return nil
}

// check compares one ledger snapshot with the scanned pairs.
func (r *run) check(ctx context.Context, ledger string, c *Check) error {
	if c.Checked == 0 {
		return nil
	}
	const missingWhere = ` l WHERE NOT EXISTS (SELECT 1 FROM ` + tmpStream + ` s WHERE s.msg_id = l.msg_id)`
	if err := r.conn.QueryRow(ctx, `SELECT count(*) FROM `+ledger+missingWhere).Scan(&c.Missing); err != nil {
		return fmt.Errorf("count missing: %w", err)
	}
	if c.Missing > 0 && r.cfg.Examples > 0 {
		rows, err := r.conn.Query(ctx, `SELECT l.msg_id, l.at FROM `+ledger+missingWhere+` ORDER BY l.at, l.msg_id LIMIT $1`, r.cfg.Examples)
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
	const dupFrom = ` FROM ` + tmpDups + ` d WHERE EXISTS (SELECT 1 FROM %s l WHERE l.msg_id = d.msg_id)`
	if err := r.conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*)`+dupFrom, ledger)).Scan(&c.Duplicated); err != nil {
		return fmt.Errorf("count duplicated: %w", err)
	}
	if c.Duplicated > 0 {
		var err error
		c.DuplicatedExamples, err = r.duplicates(ctx, fmt.Sprintf(`SELECT d.msg_id, d.copies, d.seqs`+dupFrom+` ORDER BY d.first_seq LIMIT $1`, ledger))
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
	rows, err := r.conn.Query(ctx, query, r.cfg.Examples)
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
