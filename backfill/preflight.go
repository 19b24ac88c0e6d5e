package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/backoff"
)

// preflight checks the queue, its other consumers, and the stream.
func (b *runner) preflight(ctx context.Context) error {
	conn, err := amqpio.DialURL(b.cfg.AMQPURL, amqpio.DialOptions{TLS: b.cfg.TLS, Timeout: dialTimeout})
	if err != nil {
		return fmt.Errorf("amqp: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: channel: %w", err)
	}
	q, err := ch.QueueDeclarePassive(b.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("amqp: queue %q: %w", b.cfg.Queue, err)
	}
	// A consumer whose process just died (a crashed earlier run) is still
	// counted until RabbitMQ has closed its connection: give it a moment.
	for wait := 0; q.Consumers > 0 && !b.cfg.AllowOtherConsumers && wait < 10; wait++ {
		if !backoff.Sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
		if q, err = ch.QueueDeclarePassive(b.cfg.Queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: queue %q: %w", b.cfg.Queue, err)
		}
	}
	b.depth0 = int64(q.Messages)
	if q.Consumers > 0 {
		if !b.cfg.AllowOtherConsumers {
			return fmt.Errorf("%w: queue %q has %d consumer(s) that would take some of its messages; stop them, or pass --allow-other-consumers", ErrOtherConsumers, b.cfg.Queue, q.Consumers)
		}
		b.log.Warn("other consumers share the queue: they will take some of its messages", "queue", b.cfg.Queue, "consumers", q.Consumers)
	}
	if b.cfg.DeadLetterQueue != "" && !b.cfg.DryRun {
		ch2, err := conn.Channel()
		if err != nil {
			return err
		}
		if _, err := ch2.QueueDeclarePassive(b.cfg.DeadLetterQueue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: dead-letter queue %q: %w (declare it first)", b.cfg.DeadLetterQueue, err)
		}
	}
	if _, err := b.js.Stream(ctx, b.cfg.Stream); err != nil {
		return fmt.Errorf("nats: stream %q: %w", b.cfg.Stream, err)
	}
	// A message whose row is owed to JetStream is skipped: the relay will
	// deliver it, unless an instance runs without nats. Rechecked during the
	// run (recheckDualWrite): a quiet instance shows only once it finishes rows.
	if err := b.checkDualWrite(ctx); err != nil {
		if !b.cfg.DryRun || !errors.Is(err, ErrNotDualWrite) {
			return err
		}
		b.log.Warn("backfill: a real run would refuse to start", "error", err.Error())
	}
	b.log.Info("backfill starting", "queue", b.cfg.Queue, "depth", b.depth0, "stream", b.cfg.Stream, "dry_run", b.cfg.DryRun)
	return nil
}
