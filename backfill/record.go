package backfill

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/uuidtext"
)

// known returns the ids JetStream already has or will get without the
// backfill: delivered by the relay (recorded in the delivered table, or
// still in the outbox, or in the owed table delivered to JetStream or owed
// to it: the relay will deliver those itself), or moved by an earlier
// backfill run. Of the delivered table it asks only about rows the relay
// sent to RabbitMQ too (amqp_sent): only they can be in the legacy queue,
// and only they are in its message_id index (migration 00006).
func (b *runner) known(ctx context.Context, items []*item) (map[string]bool, error) {
	var uuids, all []string
	for _, it := range items {
		all = append(all, it.id)
		if uuidtext.Is(it.id) {
			uuids = append(uuids, it.id)
		}
	}
	known := map[string]bool{}
	// One round trip, in a transaction that keeps the lookup on the tables'
	// indexes however they grew during the run (outboxsql.ReadBegin); an
	// error skips the rest, and the pool drops a connection left in it.
	q := &pgx.Batch{}
	for _, stmt := range outboxsql.ReadBegin {
		q.Queue(stmt)
	}
	q.Queue(outboxsql.For(b.cfg.Table).Known, pgx.StrictStructArgs(outboxsql.KnownParams{UUIDs: uuids, IDs: all})).
		Query(func(rows pgx.Rows) error {
			var id string
			_, err := pgx.ForEachRow(rows, []any{&id}, func() error {
				known[id] = true
				return nil
			})
			return err
		})
	q.Queue("COMMIT")
	if err := b.cfg.DB.SendBatch(ctx, q).Close(); err != nil {
		return nil, err
	}
	// Match ids as the items spell them (the database returns lower case).
	for _, it := range items {
		if !known[it.id] && uuidtext.Is(it.id) && known[uuidtext.Lower(it.id)] {
			known[it.id] = true
		}
	}
	return known, nil
}

// record notes the moved ids, so a rerun skips them.
func (b *runner) record(ctx context.Context, moved []*item) error {
	ids := make([]string, len(moved))
	derived := make([]bool, len(moved))
	for i, it := range moved {
		ids[i], derived[i] = it.id, it.derived
	}
	p := outboxsql.RecordMovedParams{IDs: ids, Derived: derived, Queue: b.cfg.Queue}
	_, err := b.cfg.DB.Exec(ctx, outboxsql.For(b.cfg.Table).RecordMoved, pgx.StrictStructArgs(p))
	return err
}

// recordMoved records moved ids, trying again while ctx lasts (the batch's
// time to settle) when Postgres fails: a message acked unrecorded whose ack
// is then lost is published again, past the duplicate window a second copy.
func (b *runner) recordMoved(ctx context.Context, moved []*item) error {
	wait := recordBackoff.Next(0)
	for {
		err := b.record(ctx, moved)
		if err == nil || ctx.Err() != nil {
			return err
		}
		b.log.Debug("backfill: record of moved ids failed; trying again", "error", err.Error(), "wait", wait)
		if !backoff.Sleep(ctx, wait) {
			return err
		}
		wait = recordBackoff.Next(wait)
	}
}

// recordBackoff spaces the attempts to record a batch's moved ids.
var recordBackoff = backoff.Doubling{Floor: 100 * time.Millisecond, Cap: 2 * time.Second}
