package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/outboxsql"
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
	// One round trip, in a transaction that keeps the lookup on the tables'
	// indexes however they grew during the run (outboxsql.ReadBegin); an
	// error skips the rest, and the pool drops a connection left in it.
	q := &pgx.Batch{}
	for _, stmt := range outboxsql.ReadBegin {
		q.Queue(stmt)
	}
	q.Queue(outboxsql.For(b.cfg.Table).Known, uuids, all).
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
	_, err := b.cfg.DB.Exec(ctx, outboxsql.For(b.cfg.Table).RecordMoved, ids, derived, b.cfg.Queue)
	return err
}

// recordMoved records moved ids, trying again while ctx lasts (the batch's
// time to settle) when Postgres fails: a message acked unrecorded comes
// back when the ack is lost (the connection dropping with it) and is
// published again, a second copy in the stream once JetStream's duplicate
// window has passed. Acking on the first failure made every blip of
// Postgres a window for that.
func (b *runner) recordMoved(ctx context.Context, moved []*item) error {
	wait := recordRetryMin
	for {
		err := b.record(ctx, moved)
		if err == nil || ctx.Err() != nil {
			return err
		}
		b.log.Debug("backfill: record of moved ids failed; trying again", "error", err.Error(), "wait", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, recordRetryMax)
	}
}

// The waits between attempts to record a batch's moved ids.
const (
	recordRetryMin = 100 * time.Millisecond
	recordRetryMax = 2 * time.Second
)

// dryRun looks at every ready message (up to Limit) without acking any,
// counts what a real run would do, then returns them all to the queue by
// closing the channel. Nothing is published and nothing recorded.
func (b *runner) dryRun(ctx context.Context) (Summary, error) {
	conn, err := amqp.DialTLS(b.cfg.AMQPURL, b.cfg.TLS)
	if err != nil {
		return Summary{}, fmt.Errorf("amqp: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return Summary{}, err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, b.cfg.Queue, "relayd-backfill-dry-run", false, false, false, false, nil)
	if err != nil {
		return Summary{}, fmt.Errorf("amqp: consume: %w", err)
	}
	want := b.depth0
	if b.cfg.Limit > 0 {
		want = min(want, b.cfg.Limit)
	}
	var batch []*item
	check := func() error {
		known, err := b.known(ctx, batch)
		if err != nil {
			return fmt.Errorf("read the relay's record: %w", err)
		}
		for _, it := range batch {
			switch {
			case known[it.id]:
				b.already.Add(1)
			case it.bad != "":
				if b.cfg.DeadLetterQueue != "" {
					b.dead.Add(1)
				} else {
					b.failed.Add(1)
				}
			default:
				b.moved.Add(1)
				if it.derived {
					b.derived.Add(1)
				}
			}
		}
		batch = batch[:0]
		b.progress()
		return nil
	}
	seen := int64(0)
	for seen < want {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return b.summary(), ctx.Err()
			}
			seen++
			batch = append(batch, b.prepare(d))
			if len(batch) >= batchMax {
				if err := check(); err != nil {
					return b.summary(), err
				}
			}
		case <-time.After(time.Second):
			want = seen // the queue had fewer than it said (other consumers)
		case <-ctx.Done():
			want = seen
		}
	}
	if err := check(); err != nil {
		return b.summary(), err
	}
	// Closing the channel returns every unacked delivery to the queue.
	return b.summary(), ch.Close()
}
