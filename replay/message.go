package replay

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/relay"
)

// skip is why a message is not published; "" means it is.
type skip string

const (
	send             skip = ""
	skipWithoutID    skip = "without_id"    // no Nats-Msg-Id: nothing to dedupe it by
	skipOtherSubject skip = "other_subject" // not under the subject prefix: not the relay's
	skipDelivered    skip = "delivered"     // the delivered record says RabbitMQ confirmed it
	skipOwed         skip = "owed"          // in the outbox or the owed table, RabbitMQ has it or the relays will send it
	skipBackfilled   skip = "backfilled"    // moved from the legacy queue: RabbitMQ had it first
)

// toAMQP is the message the relay would have published to RabbitMQ for a
// stream message: the Nats-Msg-Id as message id, the subject less prefix as
// routing key, the headers the relay copied (natssink adds only Nats-*
// ones), and as timestamp the time JetStream stored it, since the row's
// created_at is not in the stream. The sink's Publishing turns the headers
// that name an AMQP property (type, content-type, ...) into it, as it did
// for the row.
func toAMQP(subject string, h nats.Header, data []byte, stored time.Time, prefix string) (*relay.Message, skip) {
	topic, ok := strings.CutPrefix(subject, prefix)
	if !ok || topic == "" {
		return nil, skipOtherSubject
	}
	id := h.Get(jetstream.MsgIDHeader)
	if id == "" {
		return nil, skipWithoutID
	}
	m := &relay.Message{MessageID: id, Topic: topic, Payload: data, CreatedAt: stored}
	for k, v := range h {
		if len(v) == 0 || strings.HasPrefix(strings.ToLower(k), "nats-") {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(h))
		}
		m.Headers[k] = v[0] // the relay sets one value a key
	}
	return m, send
}
