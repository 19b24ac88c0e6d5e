package backfill

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/outbox"
)

// item is one delivery on its way.
type item struct {
	d       amqp.Delivery
	acks    *acker // settles d
	id      string
	derived bool
	subject string
	msg     *nats.Msg
	bad     string     // why JetStream can never take it, or ""
	span    trace.Span // its move, when traced (startSpan)
}

func (b *runner) prepare(d amqp.Delivery) *item {
	it := &item{d: d, id: d.MessageId}
	if it.id == "" {
		it.id, it.derived = DeriveID(d), true
	}
	key := b.mapKey(d.RoutingKey)
	it.subject = b.cfg.SubjectPrefix + key
	if err := outbox.ValidateTopic(key); err != nil {
		it.bad = fmt.Sprintf("routing key %q is not a valid subject: %v", key, err)
		return it
	}
	// A header key NATS refuses would fail the publish every time (nats.go
	// refuses the whole message), and a Nats- header would tell JetStream
	// what to do with it (Nats-Rollup purges the subject): refused for good.
	if reason := badHeaderKey(d.Headers); reason != "" {
		it.bad = "header " + reason
		return it
	}
	it.msg = &nats.Msg{Subject: it.subject, Data: d.Body, Header: natsHeaders(d)}
	if it.derived {
		it.msg.Header.Set(DerivedIDHeader, it.id)
	}
	// Nats-Msg-Id and Nats-Expected-Stream are set here rather than by
	// jetstream.WithMsgID and WithExpectStream: the same headers, without
	// the options' allocations per message.
	it.msg.Header[jetstream.MsgIDHeader] = []string{it.id}
	it.msg.Header[jetstream.ExpectedStreamHeader] = []string{b.cfg.Stream}
	if size := jspub.PayloadSize(it.msg); size > b.cfg.NATS.MaxPayload() {
		it.bad = fmt.Sprintf("message of %d bytes with its headers exceeds the NATS server's max_payload %d", size, b.cfg.NATS.MaxPayload())
	}
	return it
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
