package backfill

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// brokerHeaders are the headers RabbitMQ adds to a message on its way: a
// quorum queue's count of deliveries (on each redelivery), dead-lettering's
// history, and the federation/shovel hop. They say what happened to the
// message, not what it is, and stay out of its derived id.
var brokerHeaders = map[string]bool{
	"x-delivery-count":       true,
	"x-death":                true,
	"x-first-death-exchange": true,
	"x-first-death-queue":    true,
	"x-first-death-reason":   true,
	"x-last-death-exchange":  true,
	"x-last-death-queue":     true,
	"x-last-death-reason":    true,
	"x-received-from":        true,
}

// DeriveID is the id of a message that has no message-id: a UUID (version
// 8, RFC 9562) built from the SHA-256 of its routing key, timestamp, type,
// correlation id, content type, headers (sorted by name; not those RabbitMQ
// adds on the way, brokerHeaders) and body. The same message always gets the
// same id — redelivered, dead-lettered and consumed again — so a rerun after
// a crash publishes it with the same Nats-Msg-Id, and an inbox reading the
// legacy queue finds the id of its backfilled copy. Two messages identical in
// all of these are treated as one.
func DeriveID(d amqp.Delivery) string {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field(d.RoutingKey)
	if !d.Timestamp.IsZero() {
		field(d.Timestamp.UTC().Format(time.RFC3339Nano))
	} else {
		field("")
	}
	field(d.Type)
	field(d.CorrelationId)
	field(d.ContentType)
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		if !brokerHeaders[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		field(k)
		field(headerValue(d.Headers[k]))
	}
	field(string(d.Body))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x80 // version 8
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	s := hex.EncodeToString(u[:])
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}
