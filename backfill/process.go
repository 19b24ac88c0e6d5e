package backfill

import (
	"cmp"
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/backoff"
)

// retryInPlace is how long after its batch's first delivery came a message
// that cannot move for now is kept and tried again before it goes back to
// the queue: within RabbitMQ's consumer_timeout, and one return against a
// quorum queue's delivery-limit per retryInPlace.
const retryInPlace = 10 * time.Minute

// requeueSettle is how long after a requeue the queue is not taken as
// drained: far longer than RabbitMQ takes to redeliver to its consumer.
const requeueSettle = time.Second

// process settles one batch (settle), keeping what cannot move for now and
// trying it again here after a wait: a quorum queue counts each requeue
// against its delivery-limit. It requeues them when ctx ends or retryInPlace
// after received. Each attempt takes one of slots (nil: no limit).
func (b *runner) process(ctx context.Context, acks *acker, ds []amqp.Delivery, dlq *deadLetter, received time.Time, slots chan struct{}) {
	inPlace := cmp.Or(b.cfg.test.retryInPlace, retryInPlace)
	items := make([]*item, len(ds))
	for i, d := range ds {
		items[i] = b.prepare(d)
		items[i].acks = acks
		b.startSpan(items[i], received)
	}
	for {
		if slots != nil && !takeSlot(ctx, slots, received.Add(inPlace)) {
			// Stopping, or its time passed while the slots were busy: back
			// to the queue, untried this time.
			b.requeueAll(items)
			return
		}
		retry, err := b.settle(ctx, acks, items, dlq)
		if slots != nil {
			<-slots
		}
		if len(retry) == 0 {
			return
		}
		for _, it := range retry {
			acks.keep(it.d)
		}
		backoff.Sleep(ctx, b.retryWait(retry, err))
		if ctx.Err() != nil || time.Since(received) >= inPlace {
			b.requeueAll(retry)
			return
		}
		items = retry
	}
}

// takeSlot waits for a slot of slots, until ctx ends or the deadline
// passes: it says whether it took one.
func takeSlot(ctx context.Context, slots chan struct{}, deadline time.Time) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case slots <- struct{}{}:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

func (b *runner) requeueAll(items []*item) {
	for _, it := range items {
		b.requeue(it)
	}
}

func (b *runner) requeue(it *item) {
	it.endSpan("requeued", "back to the queue: could not move for now")
	if err := it.acks.requeue(it.d); err == nil {
		b.requeued.Add(1)
	}
	b.lastRequeue.Store(time.Now().UnixNano())
}
