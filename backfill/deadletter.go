package backfill

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ReasonHeader carries, on a dead-lettered message, why JetStream refused it.
const ReasonHeader = "x-relay-dead-letter-reason"

// The headers with which a dead-lettered message keeps where it was
// published to — the dead-letter publish goes through the default exchange
// to the dead-letter queue, and a message re-driven from there needs its
// routing key (its subject) and exchange — and its expiration, which it
// does not keep as a property (it would expire in the dead-letter queue).
const (
	RoutingKeyHeader = "x-relay-original-routing-key"
	ExchangeHeader   = "x-relay-original-exchange"
	ExpirationHeader = "x-relay-original-expiration"
)

// deadLetter is a connection's channel to the dead-letter queue, in confirm
// mode, with its returns.
type deadLetter struct {
	ch      *amqp.Channel
	returns <-chan amqp.Return
	mu      sync.Mutex // one publish at a time: a return is its publish's
}

// openDeadLetter opens the dead-letter channel on conn. closed and gone
// both tell of its close (RabbitMQ may close it alone, a channel error):
// one for the consume loop, one for the watch on the connection.
func openDeadLetter(conn *amqp.Connection) (d *deadLetter, closed, gone chan *amqp.Error, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, nil, nil, err
	}
	d = &deadLetter{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 64))}
	return d, ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyClose(make(chan *amqp.Error, 1)), nil
}

// publish puts pub in queue and waits for RabbitMQ to take it: confirmed,
// and not returned. Mandatory, so a queue deleted since the start comes
// back as a return — which RabbitMQ follows with an ack: that ack alone
// would have the source acked and the message gone from both brokers.
func (d *deadLetter) publish(ctx context.Context, queue string, pub amqp.Publishing) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.staleReturns()
	dc, err := d.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, pub)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("nacked")
	}
	// amqp091-go hands a return to its listener before it reads the
	// confirm that follows it: if this publish came back, it is buffered.
	for {
		select {
		case r, ok := <-d.returns:
			if !ok {
				return errors.New("dead-letter channel closed")
			}
			// Another publish's — one whose wait gave up, its message
			// requeued — unless the same message.
			if r.MessageId == pub.MessageId && bytes.Equal(r.Body, pub.Body) {
				return fmt.Errorf("returned: %d %s", r.ReplyCode, r.ReplyText)
			}
		default:
			return nil
		}
	}
}

// staleReturns drops the returns of publishes whose wait gave up (their
// messages were requeued), so that the buffer does not fill.
func (d *deadLetter) staleReturns() {
	for {
		select {
		case _, ok := <-d.returns:
			if !ok {
				return // the channel is closed: the publish says so
			}
		default:
			return
		}
	}
}

// refuse parks a message JetStream will never take: in the dead-letter
// queue (then ack), or held unacked for the rest of the connection (the
// acks of the messages after it go out one by one). An error means try
// again after a wait.
func (b *runner) refuse(ctx context.Context, it *item, reason string, dlq *deadLetter) error {
	// Warned once a message: one whose dead-letter publish fails comes
	// back here every few seconds, and retryWait's warning says why.
	b.mu.Lock()
	again := b.retrying[it.id] > 0
	b.mu.Unlock()
	level := slog.LevelWarn
	if again {
		level = slog.LevelDebug
	}
	b.log.Log(ctx, level, "backfill: JetStream refuses message for good", "message_id", it.id, "routing_key", it.d.RoutingKey, "reason", reason)
	if dlq == nil {
		b.hold(it)
		it.endSpan("held", reason)
		return nil
	}
	if err := dlq.publish(ctx, b.cfg.DeadLetterQueue, deadLetterPublishing(it.d, reason)); err != nil {
		b.log.Debug("backfill: dead-letter publish failed; trying again", "message_id", it.id, "error", err.Error())
		return fmt.Errorf("dead-letter publish: %w", err)
	}
	it.endSpan("dead_lettered", reason)
	it.acks.ack(it.d, func() { b.dead.Add(1) })
	b.forgetRetries([]*item{it})
	return nil
}

// hold leaves a refused message unacked until the connection ends, then
// it is back in the queue; each message counts once a run in Failed.
func (b *runner) hold(it *item) {
	it.acks.hold(it.d)
	b.mu.Lock()
	seen := b.seenHeld[it.id]
	b.seenHeld[it.id] = true
	b.mu.Unlock()
	if !seen {
		b.failed.Add(1)
	}
	b.forgetRetries([]*item{it})
}

// heldThisRun counts the messages held this run, each once.
func (b *runner) heldThisRun() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seenHeld)
}

// deadLetterPublishing is d as it goes to the dead-letter queue: its
// properties and headers, the reason, and where it was published to.
func deadLetterPublishing(d amqp.Delivery, reason string) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[ReasonHeader] = reason
	headers[RoutingKeyHeader] = d.RoutingKey
	headers[ExchangeHeader] = d.Exchange
	if d.Expiration != "" {
		headers[ExpirationHeader] = d.Expiration
	}
	return amqp.Publishing{
		Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type,
		AppId: d.AppId, Body: d.Body,
	}
}
