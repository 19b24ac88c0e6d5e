package backfill

import (
	"context"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// consume hands the deliveries on in batches until the run should stop
// (then it returns nil, and finish follows) or the connection is lost (then
// it returns why, once the batches handed on are done).
func (c *consumerConn) consume(ctx context.Context) error {
	for !c.stopping {
		select {
		case <-ctx.Done():
			c.stop(ctx.Err())
		case e := <-c.closed:
			c.flush()
			c.wg.Wait()
			return fmt.Errorf("%w: %v", errLost, e)
		case e := <-c.dlqClosed:
			c.cancelGone()
			c.flush()
			c.wg.Wait()
			return fmt.Errorf("%w: dead-letter channel: %v", errLost, e)
		case a, ok := <-c.stamped:
			if !ok {
				return c.stampingEnded(ctx)
			}
			c.add(a)
		case <-c.flushT.C:
			c.flush()
		case <-c.checkT.C:
			c.flush()
			c.check(ctx)
		}
	}
	return nil
}

// add takes a delivery into the batch, or back to the queue past the limit.
func (c *consumerConn) add(a arrival) {
	if c.b.cfg.Limit > 0 && c.taken() >= c.b.cfg.Limit {
		c.acks.requeue(a.d) //nolint:errcheck // beyond the limit: back to the queue
		c.limitStop = true
		c.stop(nil)
		return
	}
	c.reserved++
	c.inFlight.Add(1)
	c.batch = append(c.batch, a.d)
	if len(c.batch) == 1 {
		c.batchFrom = a.at
		c.flushT.Reset(batchWait)
	}
	if len(c.batch) >= batchMax {
		c.flush()
	}
}

// taken counts the deliveries toward Limit, less those requeued to try
// again (they come back, and count then).
func (c *consumerConn) taken() int64 {
	return c.reserved - (c.b.requeued.Load() - c.requeued0)
}

// flush hands the batch on to process. Each batch takes a slot for each
// attempt, not for its waits between attempts; up to 4 × parallel batches
// are on their way at once.
func (c *consumerConn) flush() {
	if len(c.batch) == 0 {
		return
	}
	items, from := slices.Clone(c.batch), c.batchFrom // a batch of one does not keep 256 deliveries' room
	c.batch = c.batch[:0]
	if c.b.cfg.test.onFlush != nil {
		c.b.cfg.test.onFlush(c.inFlight.Load())
	}
	c.batches <- struct{}{}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.batches }()
		c.b.process(c.gone, c.acks, items, c.dlq, from, c.slots)
		c.inFlight.Add(-int64(len(items)))
		c.b.progress()
	}()
}

// stop ends the consume loop: err, when not nil, ends the run too, and
// nothing is tried again.
func (c *consumerConn) stop(err error) {
	if err != nil {
		c.cancelGone()
	}
	if !c.stopping {
		c.stopping, c.endErr = true, err
		c.ch.Cancel(consumerTag, false) //nolint:errcheck // the channel closes with the connection anyway
	}
}

// stampingEnded says why the deliveries stopped coming: the connection or
// the dead-letter channel lost, when they told, or the consumer closed.
func (c *consumerConn) stampingEnded(ctx context.Context) error {
	c.cancelGone()
	c.flush()
	c.wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case e := <-c.closed:
		return fmt.Errorf("%w: %v", errLost, e)
	case e := <-c.dlqClosed:
		return fmt.Errorf("%w: dead-letter channel: %v", errLost, e)
	default:
	}
	return fmt.Errorf("%w: consumer closed", errLost)
}

// check, on every tick, stops the loop when a relay left dual write, the
// limit is reached, held messages fill the prefetch, or the queue is
// drained.
func (c *consumerConn) check(ctx context.Context) {
	b := c.b
	if err := b.recheckDualWrite(ctx); err != nil {
		c.stop(err)
		return
	}
	if b.cfg.Limit > 0 && c.taken() >= b.cfg.Limit && c.inFlight.Load() == 0 {
		c.limitStop = true
		c.stop(nil)
		return
	}
	// RabbitMQ delivers nothing more, and the queue would never drain.
	if n := c.acks.heldCount(); n >= b.cfg.Prefetch {
		c.stop(fmt.Errorf("%w: %d messages JetStream refuses for good hold the whole prefetch (%d); rerun with --dead-letter-queue", ErrHeldFull, n, b.cfg.Prefetch))
		return
	}
	// Not drained while ours are in flight, nor just after a requeue: the
	// message on its way back to us is neither ready nor in flight.
	if b.cfg.Follow || c.inFlight.Load() > 0 || time.Since(time.Unix(0, b.lastRequeue.Load())) < requeueSettle {
		return
	}
	if drained, err := b.drained(c.conn); err == nil && drained {
		c.drainedStop = true
		c.stop(nil)
	}
}

// drained reports whether the queue has no ready message and, unless other
// consumers are allowed, no consumer but this one: a dead connection's
// consumer may still have deliveries unacked, which will come back.
func (b *runner) drained(conn *amqp.Connection) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(b.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return false, err
	}
	if q.Messages == 0 && !b.cfg.AllowOtherConsumers && q.Consumers > 1 {
		if now := time.Now(); now.Sub(b.lastGhostWarn) >= retryWarnEvery {
			b.lastGhostWarn = now
			b.log.Warn("backfill: nothing ready, but another consumer is on the queue and may hold messages unacked (a connection of an earlier session not yet closed by RabbitMQ?); waiting for it to go",
				"queue", b.cfg.Queue, "consumers", q.Consumers)
		}
		return false, nil
	}
	return q.Messages == 0, nil
}
