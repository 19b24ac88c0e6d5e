package backfill

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/internal/msgid"
	"github.com/relayd/relayd/outbox"
)

// item is one delivery on its way.
type item struct {
	d       amqp.Delivery
	acks    *acker // settles d
	id      string
	derived bool
	subject string
	stream  string // the stream that must store it; "": any that captures subject
	msg     *nats.Msg
	bad     string     // why JetStream can never take it, or ""
	span    trace.Span // its move, when traced (startSpan)
}

func (b *runner) prepare(d amqp.Delivery) *item {
	it := &item{d: d, id: d.MessageId}
	if it.id == "" {
		it.id, it.derived = msgid.DeriveID(d), true
	}
	// A header key NATS refuses would fail the publish every time (nats.go
	// refuses the whole message), and a Nats- header would tell JetStream
	// what to do with it (Nats-Rollup purges the subject): refused for good.
	if reason := badHeaderKey(d.Headers); reason != "" {
		it.bad = "header " + reason
		return it
	}
	h := natsHeaders(d)
	it.subject, it.stream = b.destination(d, h)
	if err := outbox.ValidateTopic(it.subject); err != nil {
		it.bad = fmt.Sprintf("routing key %q gives subject %q, not a valid one: %v", d.RoutingKey, it.subject, err)
		return it
	}
	it.msg = &nats.Msg{Subject: it.subject, Data: d.Body, Header: h}
	if it.derived {
		it.msg.Header.Set(DerivedIDHeader, it.id)
	}
	// Nats-Msg-Id and Nats-Expected-Stream are set here rather than by
	// jetstream.WithMsgID and WithExpectStream: the same headers, without
	// the options' allocations per message.
	it.msg.Header[jetstream.MsgIDHeader] = []string{it.id}
	if it.stream != "" {
		it.msg.Header[jetstream.ExpectedStreamHeader] = []string{it.stream}
	}
	if size := jspub.PayloadSize(it.msg); size > b.cfg.NATS.MaxPayload() {
		it.bad = fmt.Sprintf("message of %d bytes with its headers exceeds the NATS server's max_payload %d", size, b.cfg.NATS.MaxPayload())
	}
	return it
}

// destination is where d goes in JetStream: as the relay would have sent
// the row a route of Config.Routes sent there, or else on SubjectPrefix and
// the mapped routing key, into Stream. h is d's headers as NATS gets them.
func (b *runner) destination(d amqp.Delivery, h nats.Header) (subject, stream string) {
	if r := b.cfg.Routes; r != nil && len(r.Routes()) > 0 {
		flat := make(map[string]string, len(h))
		for k, v := range h {
			flat[k] = v[0]
		}
		if topic, ok := r.FromAMQP(d.Exchange, d.RoutingKey, flat); ok {
			if dest, name := r.Resolve(topic, flat); name != "" { // not the default route: the map's
				return dest.Subject, dest.Stream
			}
		}
	}
	return b.cfg.SubjectPrefix + b.mapKey(d.RoutingKey), b.cfg.Stream
}

func (b *runner) mapKey(key string) string {
	best := ""
	for from := range b.cfg.SubjectMap {
		if strings.HasPrefix(key, from) && len(from) > len(best) {
			best = from
		}
	}
	if best == "" {
		return key
	}
	return b.cfg.SubjectMap[best] + strings.TrimPrefix(key, best)
}
