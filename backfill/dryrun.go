package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/relayd/relayd/internal/amqpio"
)

// dryRun looks at every ready message (up to Limit) without acking any,
// counts what a real run would do, then returns them all to the queue by
// closing the channel. Nothing is published and nothing recorded.
func (b *runner) dryRun(ctx context.Context) (Summary, error) {
	conn, err := amqpio.DialURL(b.cfg.AMQPURL, amqpio.DialOptions{TLS: b.cfg.TLS, Timeout: dialTimeout})
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
				if err := b.dryCount(ctx, batch); err != nil {
					return b.summary(), err
				}
				batch = batch[:0]
			}
		case <-time.After(time.Second):
			want = seen // the queue had fewer than it said (other consumers)
		case <-ctx.Done():
			want = seen
		}
	}
	if err := b.dryCount(ctx, batch); err != nil {
		return b.summary(), err
	}
	// Closing the channel returns every unacked delivery to the queue.
	return b.summary(), ch.Close()
}

// dryCount counts what a real run would do with batch.
func (b *runner) dryCount(ctx context.Context, batch []*item) error {
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
	b.progress()
	return nil
}
