package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/uuidtext"
)

// known returns the ids JetStream already has or will get without the
// backfill: delivered by the relay (recorded in the delivered table, or
// still in the outbox delivered to JetStream or owed to it: the relay will
// deliver those itself), or moved by an earlier backfill run. Of the
// delivered table it asks only about rows the relay sent to RabbitMQ too
// (amqp_sent): only they can be in the legacy queue, and only they are in
// its message_id index (migration 00006).
func (b *runner) known(ctx context.Context, items []*item) (map[string]bool, error) {
	var uuids, all []string
	for _, it := range items {
		all = append(all, it.id)
		if uuidtext.Is(it.id) {
			uuids = append(uuids, it.id)
		}
	}
	known := map[string]bool{}
	tbl := b.cfg.Table.Ident()
	// Read through the indexes, however the tables grew since the
	// statement was prepared. A generic plan made while the backfilled
	// table was small scans it whole and compares every row with every id
	// of the batch, and keeps doing so as the run grows the table:
	// quadratic over a run. A custom plan hashes the ids but still scans
	// the table until it is far larger than a batch.
	//
	// One round trip: the transaction's statements go out together (a pgx
	// batch; an error skips the rest, and the pool drops a connection left
	// in a transaction).
	//
	// The uuids travel as text and Postgres casts them: pgx has no binary
	// encoding of a Go string as a uuid, and its way there (an encode
	// error formatted with fmt, then the text format) cost about 7 % of
	// the backfill's CPU.
	q := &pgx.Batch{}
	for _, stmt := range knownBegin {
		q.Queue(stmt)
	}
	q.Queue(fmt.Sprintf(`
SELECT message_id::text FROM %s
WHERE message_id = ANY($1::text[]::uuid[])
  AND (nats_delivered_at IS NOT NULL OR (done_at IS NULL AND nats_parked_at IS NULL))
UNION ALL
SELECT message_id::text FROM %s WHERE message_id = ANY($1::text[]::uuid[]) AND nats_delivered_at IS NOT NULL AND amqp_sent
UNION ALL
SELECT message_id FROM %s WHERE message_id = ANY($2::text[])`, tbl, b.cfg.Table.Delivered(), b.cfg.Table.Backfilled()), uuids, all).
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

// knownBegin keeps the lookup on the tables' indexes.
var knownBegin = []string{"BEGIN READ ONLY", "SET LOCAL enable_seqscan = off"}

// record notes the moved ids, so a rerun skips them.
func (b *runner) record(ctx context.Context, moved []*item) error {
	ids := make([]string, len(moved))
	derived := make([]bool, len(moved))
	for i, it := range moved {
		ids[i], derived[i] = it.id, it.derived
	}
	_, err := b.cfg.DB.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (message_id, queue, derived)
SELECT id, $3, d FROM unnest($1::text[], $2::boolean[]) AS u(id, d)
ON CONFLICT (message_id) DO NOTHING`, b.cfg.Table.Backfilled()), ids, derived, b.cfg.Queue)
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
