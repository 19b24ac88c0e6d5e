package backfill

import (
	"cmp"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/internal/headers/amqpprop"
	"github.com/relayd/relayd/internal/msgid"
)

// DerivedIDHeader marks a message whose id was derived from its content
// (it had no AMQP message-id); its value is the id.
const DerivedIDHeader = msgid.DerivedIDHeader

// badHeaderKey says why one of t's keys cannot be a NATS header, or "" —
// the first in key order, so a message always gets the same reason.
// Nats-Msg-Id and Nats-Expected-Stream are not refused: prepare sets them.
func badHeaderKey(t amqp.Table) string {
	return headers.First(t, func(k string, _ any) string {
		if k == jetstream.MsgIDHeader || k == jetstream.ExpectedStreamHeader {
			return ""
		}
		return cmp.Or(headers.NATSKeyReason(k), headers.NATSReservedReason(k))
	})
}

// natsHeaders carries the AMQP headers over, and each property of
// headers.AMQPProperties as the header of its name ("content-type"): the
// NATS headers the relay gives the same message from an outbox row, whose
// headers it copies verbatim. A property wins over a header of its name.
func natsHeaders(d amqp.Delivery) nats.Header {
	// Room for the properties, the two Amqp- headers and the three prepare adds.
	h := make(nats.Header, len(d.Headers)+len(headers.AMQPProperties)+5)
	for k, v := range d.Headers {
		h[k] = []string{msgid.HeaderValue(v)}
	}
	for k, v := range amqpprop.FromDelivery(&d) {
		h[k] = []string{v}
	}
	// What only the AMQP side has.
	if !d.Timestamp.IsZero() {
		h.Set("Amqp-Timestamp", d.Timestamp.UTC().Format(time.RFC3339))
	}
	h.Set("Amqp-Routing-Key", d.RoutingKey)
	return h
}
