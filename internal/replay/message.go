package replay

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
)

// skip is why a message is not published; "" means it is.
type skip string

const (
	send             skip = ""
	skipWithoutID    skip = "without_id"    // no Nats-Msg-Id: nothing to dedupe it by
	skipOtherSubject skip = "other_subject" // no route gives the subject: not the relay's
	skipDelivered    skip = "delivered"     // the delivered record says RabbitMQ confirmed it
	skipOwed         skip = "owed"          // in the outbox or the owed table, RabbitMQ has it or the relays will send it
	skipBackfilled   skip = "backfilled"    // moved from the legacy queue: RabbitMQ had it first
)

// toAMQP is the message the relay would have published to RabbitMQ for a
// stream message: the Nats-Msg-Id as message id, the topic whose route gives
// the subject (routes.FromSubject) and that route's exchange and routing
// key, the headers the relay copied (natssink adds only Nats-* ones), and
// as timestamp the time JetStream stored it, since the row's created_at is
// not in the stream. The sink's Publishing turns the headers that name an
// AMQP property (type, content-type, ...) into it, as it did for the row.
func toAMQP(subject string, h nats.Header, data []byte, stored time.Time, routes *route.Table) (*relay.Message, skip) {
	id := h.Get(jetstream.MsgIDHeader)
	m := &relay.Message{MessageID: id, Payload: data, CreatedAt: stored}
	for k, v := range h {
		if len(v) == 0 || strings.HasPrefix(strings.ToLower(k), "nats-") {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(h))
		}
		m.Headers[k] = v[0] // the relay sets one value a key
	}
	topic, ok := routes.FromSubject(subject, m.Headers)
	if !ok {
		return nil, skipOtherSubject
	}
	if id == "" {
		return nil, skipWithoutID
	}
	dest, _ := routes.Resolve(topic, m.Headers)
	m.Topic, m.Route = topic, &dest
	return m, send
}
