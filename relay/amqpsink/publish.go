package amqpsink

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/internal/headers/amqpprop"
	"github.com/relayd/relayd/relay"
)

// Publish implements relay.Sink.
func (s *Sink) Publish(ctx context.Context, msgs []*relay.Message, results []error) {
	l := s.current()
	if l == nil {
		err := s.Ready()
		for i := range results {
			results[i] = err
		}
		return
	}
	waits := s.send(ctx, l, msgs, results)
	awaitConfirms(ctx, l, waits, results)
	for i, err := range results {
		if errors.Is(err, relay.ErrNacked) {
			s.nacked.Warn(msgs[i].Topic, "RabbitMQ nacked a message: a queue its topic routes to is full and refuses new messages "+
				"(x-overflow reject-publish at x-max-length), or failing. Let the queue's consumers drain it or raise its limit; "+
				"until then the row is retried, an attempt each, and parked when its attempts run out",
				"topic", msgs[i].Topic, "exchange", s.Destination(msgs[i]), "message_id", msgs[i].MessageID)
		}
	}
}

// send publishes the batch on l in one write (see amqpio.Conn), before any
// waiting starts, and returns the publish each result waits for (nil: the
// result is already set). Nothing new goes onto a connection RabbitMQ has
// blocked (the write would wait in the socket, and the confirms with it), or
// has acked nothing on for HoldAfter while publishes wait.
func (s *Sink) send(ctx context.Context, l *link, msgs []*relay.Message, results []error) []*pending {
	blocked := cmp.Or(l.blockedErr(), l.quietErr(s.cfg.HoldAfter))
	if blocked == nil {
		l.checkExchanges(s.routedExchanges(msgs))
		deadline, _ := ctx.Deadline()
		l.cork.Cork()
		defer l.cork.Uncork(deadline) //nolint:errcheck // a failed flush closes the connection: the waits end as unknown
	}
	waits := make([]*pending, len(msgs))
	for i, m := range msgs {
		waits[i], results[i] = s.sendOne(ctx, l, m, blocked)
	}
	return waits
}

// sendOne publishes m unless it cannot go, is already delivered, or is
// already in flight; blocked is l's blockedErr.
func (s *Sink) sendOne(ctx context.Context, l *link, m *relay.Message, blocked error) (*pending, error) {
	pub, err := checkedPublishing(m, l.conn.Config.FrameSize, connUser(l.conn))
	if err != nil {
		return nil, err
	}
	// In flight before late: a late confirm moves the message from the one
	// to the other (onConfirm), so it is always found in one of them.
	if p := l.inFlight(m.MessageID); p != nil {
		// An earlier publish outlived its timeout on this live connection:
		// wait for its verdict rather than queue a second copy.
		return p, nil
	}
	if s.takeLate(m.MessageID) {
		return nil, nil // confirmed after its publish gave up waiting
	}
	if blocked != nil {
		return nil, blocked
	}
	exchange, key := s.dest(m)
	if err := l.exchangeMissing(exchange); err != nil {
		s.missing.Warn("exchange "+exchange, "RabbitMQ has no exchange "+exchange+", which a route names: that route's rows wait, and are delivered once it exists. "+
			"Declare the exchange, or fix the route's amqp.exchange", "exchange", exchange, "topic", m.Topic, "node", l.node)
		return nil, err
	}
	p, err := l.publish(ctx, exchange, key, m.MessageID, pub)
	if err != nil {
		return nil, relay.Unavailable(fmt.Errorf("amqp publish: %w", err))
	}
	return p, nil
}

// awaitConfirms sets each result from its publish's verdict, or at ctx's end
// leaves the publish registered for a late confirm.
func awaitConfirms(ctx context.Context, l *link, waits []*pending, results []error) {
	for i, p := range waits {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
			results[i] = p.err
		case <-ctx.Done():
			if resolved, err := l.abandon(p); resolved {
				results[i] = err
				continue
			}
			results[i] = relay.AwaitingConfirm(fmt.Errorf("amqp: no confirm: %w", ctx.Err()))
		}
	}
}

// checkedPublishing is Publishing(m), or the permanent error of a message
// RabbitMQ cannot take. frameSize is the connection's frame_max, user the
// user it authenticated as ("" when unknown: see connUser).
func checkedPublishing(m *relay.Message, frameSize int, user string) (amqp.Publishing, error) {
	key, exchange := m.Topic, ""
	if r := m.Route; r != nil {
		key, exchange = r.RoutingKey, r.Exchange
	}
	if len(key) > 255 {
		return amqp.Publishing{}, relay.Permanent("amqp: routing key longer than 255 bytes")
	}
	if len(exchange) > 255 { // a route's placeholders filled in
		return amqp.Publishing{}, relay.Permanent("amqp: exchange name longer than 255 bytes")
	}
	if reason := headers.First(m.Headers, headers.AMQPReason); reason != "" {
		return amqp.Publishing{}, relay.Permanent("amqp: headers: %s", reason)
	}
	pub, err := publishing(m)
	if err != nil {
		return amqp.Publishing{}, relay.Permanent("amqp: headers: %v", err)
	}
	if pub.UserId != "" && pub.UserId != user {
		// RabbitMQ would close the channel (PRECONDITION_FAILED), and with
		// it every publish in flight on it.
		return amqp.Publishing{}, relay.Permanent("amqp: headers: %s", headers.AMQPUserIDReason(pub.UserId, user))
	}
	if err := pub.Headers.Validate(); err != nil {
		return amqp.Publishing{}, relay.Permanent("amqp: headers: %v", err)
	}
	if n, most := contentHeaderSize(&pub), frameSize-frameOverhead; most > 0 && n > most {
		// amqp091-go splits only the body into frames: RabbitMQ closes the
		// connection on a larger content header, and every publish on it.
		return amqp.Publishing{}, relay.Permanent("amqp: headers: the message's properties take %d bytes, more than a frame holds (%d: RabbitMQ's frame_max)", n, most)
	}
	return pub, nil
}

// connUser is the user conn authenticated as, or "" when its mechanism
// names none (EXTERNAL: the user is in the client certificate). amqp091-go
// keeps the mechanism it used, the URL's user ("guest" when it has none).
func connUser(conn *amqp.Connection) string {
	for _, a := range conn.Config.SASL {
		switch a := a.(type) {
		case *amqp.PlainAuth:
			return a.Username
		case *amqp.AMQPlainAuth:
			return a.Username
		}
	}
	return ""
}

// Publishing is the AMQP message the sink publishes for m: persistent, the
// row's message id as message-id, its created_at as timestamp, and its
// headers as a legacy publisher sets them: each that names an AMQP property
// (headers.AMQPProperties) as that property alone, the others as headers.
// It is for a message checkedPublishing takes.
func Publishing(m *relay.Message) amqp.Publishing {
	p, _ := publishing(m)
	return p
}

func publishing(m *relay.Message) (amqp.Publishing, error) {
	// No default content type: it adds nothing a consumer can use, and
	// properties past 64 bytes cost RabbitMQ (see TestPropertiesStaySmall).
	p := amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    m.MessageID,
		Timestamp:    m.CreatedAt,
		Body:         m.Payload,
	}
	err := amqpprop.Fill(&p, m.Headers)
	return p, err
}

// frameOverhead is an AMQP frame's bytes around its payload: type, channel
// and size before it, the end octet after.
const frameOverhead = 8

// contentHeaderSize is the payload of p's content header frame as amqp091-go
// writes it: class, weight, body size and property flags, then each
// property set. It counts every property amqp091-go writes.
func contentHeaderSize(p *amqp.Publishing) int {
	n := 2 + 2 + 8 + 2
	for _, s := range [...]string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo,
		p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		if s != "" {
			n += 1 + len(s) // a short string
		}
	}
	if len(p.Headers) > 0 {
		n += 4 // the table's length
		for k, v := range p.Headers {
			n += 1 + len(k) + 1 // key (a short string), value type
			if s, ok := v.(string); ok {
				n += 4 + len(s) // a long string
			} else {
				n += 8 // no other type is set; the widest scalar
			}
		}
	}
	if p.DeliveryMode != 0 {
		n++
	}
	if p.Priority != 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}
