package backfill

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// lateWait is how long finish waits for deliveries already on their way
// when the consumer was cancelled.
const lateWait = 500 * time.Millisecond

// finish ends a connection whose consume loop stopped: it waits for the
// batches on their way, settles or requeues the late deliveries, and says
// whether the run is over.
func (c *consumerConn) finish(ctx context.Context) error {
	b := c.b
	c.flush()
	c.wg.Wait()
	late := c.lateDeliveries()
	if c.drainedStop {
		if err := c.settleLate(ctx, late); err != nil {
			return err
		}
	} else {
		for _, d := range late {
			c.acks.requeue(d) //nolint:errcheck // returned to the queue
		}
	}
	if c.limitStop && c.taken() < b.cfg.Limit {
		if ctx.Err() != nil {
			return ctx.Err() // interrupted short of the limit
		}
		// The limit was reached counting deliveries that then could not
		// move for now and went back: go on for the rest.
		return errNotDrained
	}
	if n := b.heldThisRun(); n > 0 {
		b.log.Warn("messages JetStream refused for good were returned to the queue; pass --dead-letter-queue to park them", "count", n)
	}
	return c.endErr
}

// lateDeliveries collects the deliveries already on their way when the
// consumer was cancelled: RabbitMQ counts them as unacked, not ready, so
// the drain did not see them.
func (c *consumerConn) lateDeliveries() []amqp.Delivery {
	var late []amqp.Delivery
	for {
		select {
		case a, ok := <-c.stamped:
			if !ok {
				return late
			}
			late = append(late, a.d)
		case <-time.After(lateWait):
			return late
		}
	}
}

// settleLate settles the late deliveries of a drained queue, within the
// limit (those past it go back). It returns nil when the run is over, else
// why not.
func (c *consumerConn) settleLate(ctx context.Context, late []amqp.Delivery) error {
	b := c.b
	if b.cfg.Limit > 0 {
		room := max(0, min(int64(len(late)), b.cfg.Limit-c.taken()))
		for _, d := range late[room:] {
			c.acks.requeue(d) //nolint:errcheck // beyond the limit: back to the queue
		}
		late = late[:room]
	}
	lateFrom := time.Now()
	for len(late) > 0 {
		n := min(len(late), batchMax)
		b.process(c.gone, c.acks, late[:n], c.dlq, lateFrom, nil)
		late = late[n:]
	}
	b.progress()
	if ctx.Err() != nil {
		return ctx.Err() // interrupted: what could not move went back
	}
	// The channel's and connection's own state first: c.gone hears of
	// their close through a goroutine. Acks of moved messages may be lost
	// with them, and those messages back in the queue.
	if c.gone.Err() != nil || c.ch.IsClosed() || c.conn.IsClosed() {
		return fmt.Errorf("%w: while finishing the last deliveries", errLost)
	}
	if b.lastRequeue.Load() >= lateFrom.UnixNano() {
		return errNotDrained // some could not move for now and went back
	}
	return nil
}
