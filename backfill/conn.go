package backfill

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
)

const (
	batchMax  = 256
	batchWait = 20 * time.Millisecond
	parallel  = 4 // batches in flight at once

	consumerTag = "relayd-backfill"
	dialTimeout = 30 * time.Second
)

// consumerConn is one connection to RabbitMQ and the consuming done on it:
// its consumer's channel, its dead-letter channel, the batches it handed
// on. loop opens one after another until one ends the run.
type consumerConn struct {
	b    *runner
	conn *amqp.Connection
	ch   *amqp.Channel
	acks *acker
	dlq  *deadLetter // nil without a dead-letter queue

	closed    chan *amqp.Error // the connection's close
	dlqClosed chan *amqp.Error // the dead-letter channel's; nil without one: never ready
	stamped   chan arrival

	// gone ends with the connection — it, the consumer's channel or the
	// dead-letter channel closed — or with the run: batches trying again
	// in place stop, and what they keep goes back to the queue.
	gone       context.Context
	cancelGone context.CancelFunc

	// Only the consume loop reads and writes the batching fields, except
	// inFlight, which each batch's goroutine lowers once it is settled.
	wg        sync.WaitGroup
	slots     chan struct{} // a slot per attempt of a batch (process)
	batches   chan struct{} // bounds the batches on their way, tried or waiting for a slot
	inFlight  atomic.Int64  // deliveries received and not yet settled
	reserved  int64         // deliveries taken toward Limit, counting earlier connections' settled
	requeued0 int64         // the run's requeued count when the connection opened
	batch     []amqp.Delivery
	batchFrom time.Time // when batch's first delivery came
	flushT    *time.Timer
	checkT    *time.Ticker

	// How the consume loop stopped.
	stopping, drainedStop, limitStop bool
	endErr                           error
}

// arrival is a delivery and when it came.
type arrival struct {
	d  amqp.Delivery
	at time.Time
}

// dial connects to RabbitMQ: the preflight, the dry run and each
// consumerConn dial the same way.
func (b *runner) dial() (*amqp.Connection, error) {
	return amqpio.DialURL(b.cfg.AMQPURL, amqpio.DialOptions{TLS: b.cfg.TLS, Timeout: dialTimeout})
}

// open dials RabbitMQ, opens the channels and starts consuming.
func (b *runner) open(ctx context.Context) (*consumerConn, error) {
	conn, node, err := b.nodes.Dial(amqpio.DialOptions{TLS: b.cfg.TLS, Timeout: dialTimeout})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errLost, err)
	}
	if b.nodes.Len() > 1 {
		b.log.Info("backfill: connected to RabbitMQ", "node", node)
	}
	c := &consumerConn{b: b, conn: conn}
	deliveries, dlqGone, err := c.openChannels(ctx)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.closed = conn.NotifyClose(make(chan *amqp.Error, 1))
	c.acks = newAcker(c.ch)
	c.gone, c.cancelGone = context.WithCancel(ctx)
	c.watchGone(dlqGone)
	// Room for the prefetch: only unacked deliveries are in the buffer, so
	// the stamping never waits for the consume loop.
	c.stamped = make(chan arrival, max(b.cfg.Prefetch, 1))
	go c.stamp(deliveries)

	c.slots = make(chan struct{}, parallel)
	c.batches = make(chan struct{}, 4*parallel)
	c.reserved = b.moved.Load() + b.already.Load() + b.dead.Load()
	c.requeued0 = b.requeued.Load()
	c.batch = make([]amqp.Delivery, 0, batchMax)
	c.flushT = time.NewTimer(time.Hour)
	c.checkT = time.NewTicker(250 * time.Millisecond)
	return c, nil
}

// openChannels opens the consumer's channel with its prefetch, the
// dead-letter channel (dlqGone tells of its close), and the consumer.
func (c *consumerConn) openChannels(ctx context.Context) (deliveries <-chan amqp.Delivery, dlqGone chan *amqp.Error, err error) {
	b := c.b
	if c.ch, err = c.conn.Channel(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errLost, err)
	}
	if err := c.ch.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errLost, err)
	}
	if b.cfg.DeadLetterQueue != "" {
		if c.dlq, c.dlqClosed, dlqGone, err = openDeadLetter(c.conn); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errLost, err)
		}
	}
	deliveries, err = c.ch.ConsumeWithContext(ctx, b.cfg.Queue, consumerTag, false, false, false, false, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: consume: %w", errLost, err)
	}
	return deliveries, dlqGone, nil
}

// watchGone ends c.gone when the connection, the consumer's channel or the
// dead-letter channel closes. Watched apart from the consume loop, which
// waits in flush while every batch is trying again.
func (c *consumerConn) watchGone(dlqGone chan *amqp.Error) {
	connGone, chGone := c.conn.NotifyClose(make(chan *amqp.Error, 1)), c.ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		select {
		case <-connGone:
		case <-chGone:
		case <-dlqGone:
		case <-c.gone.Done():
		}
		c.cancelGone()
	}()
}

// stamp stamps each delivery as it comes, apart from the consume loop,
// which may wait in flush meanwhile: a batch's time to retry in place
// counts from its first delivery's coming.
func (c *consumerConn) stamp(deliveries <-chan amqp.Delivery) {
	defer close(c.stamped)
	for d := range deliveries {
		select {
		case c.stamped <- arrival{d, time.Now()}:
		case <-c.gone.Done():
			return // unacked, they go back with the connection
		}
	}
}

// close stops the timers and closes the connection: what is unacked goes
// back to the queue.
func (c *consumerConn) close() {
	c.flushT.Stop()
	c.checkT.Stop()
	c.cancelGone()
	c.conn.Close()
}
