package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/headers/amqpprop"
	"github.com/relayd/relayd/internal/msgid"
)

// AMQPMessage converts a RabbitMQ delivery. The id is the message-id
// property, else the [DerivedIDHeader] header, else the id derived from the
// message's content: the one `relayd backfill` gives its JetStream copy
// (docs/message-ids.md). It is normalised by [Inbox.Process], not here. The
// properties a row's headers set (type, reply-to …) are headers again, as
// the JetStream copy has them. Use it to call Process with an
// acknowledgement policy of your own; [Inbox.HandleAMQP] is the usual one.
func AMQPMessage(d amqp.Delivery) Message { return amqpMessage(d, msgid.DeriveID) }

// amqpMessage is AMQPMessage with the derivation of [Config.DeriveAMQPID].
func amqpMessage(d amqp.Delivery, derive func(amqp.Delivery) string) Message {
	m := Message{ID: d.MessageId, Source: SourceAMQP, Subject: d.RoutingKey, Payload: d.Body}
	for k, v := range d.Headers {
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(d.Headers)+2)
		}
		switch v := v.(type) {
		case string:
			m.Headers[k] = v
		case []byte:
			m.Headers[k] = string(v)
		default:
			m.Headers[k] = fmt.Sprint(v)
		}
	}
	for k, v := range amqpprop.FromDelivery(&d) {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[k] = v
	}
	if m.ID == "" {
		m.ID = m.Headers[DerivedIDHeader]
	}
	if m.ID == "" {
		m.ID = derive(d)
	}
	return m
}

// JetStreamMessage converts a JetStream message. The id is the Nats-Msg-Id
// header, else [DerivedIDHeader]; it is normalised by [Inbox.Process], not
// here. Use it to call Process with an acknowledgement policy of your own;
// [Inbox.HandleJetStream] is the usual one.
func JetStreamMessage(msg jetstream.Msg) Message {
	m := Message{Source: SourceNATS, Subject: msg.Subject(), Payload: msg.Data()}
	if h := msg.Headers(); len(h) > 0 {
		m.Headers = make(map[string]string, len(h))
		for k, vs := range h {
			if len(vs) > 0 {
				m.Headers[k] = vs[0]
			}
		}
	}
	m.ID = m.Headers[jetstream.MsgIDHeader]
	if m.ID == "" {
		m.ID = m.Headers[DerivedIDHeader]
	}
	return m
}

// poison reports whether err means the message can never be processed.
func poison(err error) bool {
	return errors.Is(err, ErrNoMessageID) || errors.Is(err, ErrInvalidMessageID)
}

// HandleAMQP processes a RabbitMQ delivery once per id with h, then settles
// it. Consume with manual acknowledgement (autoAck false) and a Qos
// prefetch.
//
//   - processed, or already processed: d.Ack; returns nil (or the ack's
//     error: the broker then redelivers and the inbox suppresses it).
//   - handler or database error: d.Nack with requeue, so it is delivered
//     again (at once: RabbitMQ has no delayed requeue); returns the error.
//   - no usable id (see [ErrNoMessageID], [ErrInvalidMessageID]; and
//     [Config.DeriveAMQPID]): d.Nack without requeue — dead-lettered if the queue has a dead-letter
//     exchange, else dropped — so a poison message cannot loop; returns the
//     error, which says why.
func (in *Inbox) HandleAMQP(ctx context.Context, d amqp.Delivery, h Handler) error {
	m := amqpMessage(d, in.cfg.DeriveAMQPID)
	_, err := in.Process(ctx, m, h)
	switch {
	case err == nil:
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("inbox: ack amqp delivery %d: %w", d.DeliveryTag, err)
		}
		return nil
	case poison(err):
		err = fmt.Errorf("rejected amqp message (routing key %q, delivery %d) without requeue: %w", d.RoutingKey, d.DeliveryTag, err)
		if nerr := d.Nack(false, false); nerr != nil {
			return errors.Join(err, fmt.Errorf("inbox: reject: %w", nerr))
		}
		return err
	default:
		if nerr := d.Nack(false, true); nerr != nil {
			return errors.Join(err, fmt.Errorf("inbox: requeue: %w", nerr))
		}
		return err
	}
}

// HandleJetStream processes a JetStream message once per id with h, then
// settles it. Use a durable consumer with explicit acks.
//
//   - processed, or already processed: msg.Ack; returns nil (or the ack's
//     error). Ack, not DoubleAck: a lost ack costs one redelivery that the
//     inbox suppresses, while DoubleAck would add a round trip to every
//     message.
//   - handler or database error: msg.NakWithDelay, RetryMin·2^(n-1) capped
//     at RetryMax where n is the message's delivery count, so redeliveries
//     back off (until the consumer's MaxDeliver, if set); returns the error.
//   - no usable id: msg.Term, so the server never redelivers it; returns the
//     error, which says why. (Term, not TermWithReason: servers before
//     2.10.4 ignore a Term that carries a reason, and the message would
//     loop.)
func (in *Inbox) HandleJetStream(ctx context.Context, msg jetstream.Msg, h Handler) error {
	_, err := in.Process(ctx, JetStreamMessage(msg), h)
	switch {
	case err == nil:
		if err := msg.Ack(); err != nil {
			return fmt.Errorf("inbox: ack nats message: %w", err)
		}
		return nil
	case poison(err):
		err = fmt.Errorf("terminated nats message (subject %q): %w", msg.Subject(), err)
		if terr := msg.Term(); terr != nil {
			return errors.Join(err, fmt.Errorf("inbox: term: %w", terr))
		}
		return err
	default:
		var delivered uint64 = 1
		if md, merr := msg.Metadata(); merr == nil {
			delivered = md.NumDelivered
		}
		if nerr := msg.NakWithDelay(in.retryDelay(delivered)); nerr != nil {
			return errors.Join(err, fmt.Errorf("inbox: nak: %w", nerr))
		}
		return err
	}
}

// retryDelay is the redelivery delay after the delivered-th delivery
// failed: RetryMin·2^(delivered-1), at most RetryMax.
func (in *Inbox) retryDelay(delivered uint64) time.Duration {
	// Clamped to fit an int: 64 doublings of RetryMin reach any real RetryMax.
	return backoff.Doubling{Floor: in.cfg.RetryMin, Cap: in.cfg.RetryMax}.Attempt(int(min(delivered, 64)))
}
