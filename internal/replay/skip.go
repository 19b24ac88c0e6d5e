package replay

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/uuidtext"
)

// lookup marks the items RabbitMQ already has or will get without the
// replay: confirmed in the delivered record, in the outbox (owed to every
// target), in the owed table delivered to it or owed to it, or moved by the
// backfill from the legacy queue. One round trip a batch, kept on the
// tables' indexes (outboxsql.ReadBegin).
func (r *runner) lookup(ctx context.Context, items []item) error {
	var uuids, all []string
	for _, it := range items {
		if it.skip != send {
			continue
		}
		all = append(all, it.msg.MessageID)
		if uuidtext.Is(it.msg.MessageID) {
			uuids = append(uuids, it.msg.MessageID)
		}
	}
	if len(all) == 0 {
		return nil
	}
	found := map[string]skip{}
	collect := func(why skip) func(pgx.Rows) error {
		return func(rows pgx.Rows) error {
			var id string
			_, err := pgx.ForEachRow(rows, []any{&id}, func() error {
				if _, ok := found[id]; !ok {
					found[id] = why
				}
				return nil
			})
			return err
		}
	}
	q := outboxsql.For(r.cfg.Table)
	b := &pgx.Batch{}
	for _, stmt := range outboxsql.ReadBegin {
		b.Queue(stmt)
	}
	// The outbox and the owed table (one statement, one snapshot) before the
	// delivered record: each statement has its own snapshot, and a row
	// leaving the first for the second in between would be found in neither.
	b.Queue(q.ReplayOwed, pgx.StrictStructArgs(outboxsql.ReplayOwedParams{UUIDs: uuids})).Query(collect(skipOwed))
	b.Queue(q.ReplayDelivered, pgx.StrictStructArgs(outboxsql.ReplayDeliveredParams{UUIDs: uuids})).Query(collect(skipDelivered))
	b.Queue(q.ReplayBackfilled, pgx.StrictStructArgs(outboxsql.ReplayBackfilledParams{IDs: all})).Query(collect(skipBackfilled))
	b.Queue("COMMIT")
	if err := r.cfg.DB.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	for i := range items {
		it := &items[i]
		if it.skip != send {
			continue
		}
		why, ok := found[it.msg.MessageID]
		if !ok && uuidtext.Is(it.msg.MessageID) {
			why, ok = found[uuidtext.Lower(it.msg.MessageID)] // Postgres spells uuids lower-case
		}
		if ok {
			it.skip = why
		}
	}
	return nil
}
