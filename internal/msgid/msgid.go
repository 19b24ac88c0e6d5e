// Package msgid derives the id of a legacy RabbitMQ message that has no
// message-id, so that `relayd backfill` and the inbox give it the same one.
// Consumers in other languages implement it from docs/message-ids.md and
// check themselves against inbox/testdata/derived-ids.json.
package msgid

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DerivedIDHeader marks a message whose id was derived from its content
// (it had no AMQP message-id); its value is the id.
const DerivedIDHeader = "Relay-Derived-Id"

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

// BrokerHeaders returns the names of the headers DeriveID leaves out, sorted.
func BrokerHeaders() []string {
	names := make([]string, 0, len(brokerHeaders))
	for k := range brokerHeaders {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// DeriveID is the id of a message that has no message-id: a UUID (version
// 8, RFC 9562) built from the SHA-256 of its routing key, timestamp, type,
// correlation id, content type, headers (sorted by name; not those RabbitMQ
// adds on the way, [BrokerHeaders]) and body. The same message always gets
// the same id — redelivered, dead-lettered and consumed again — so a rerun
// of the backfill publishes it with the same Nats-Msg-Id, and an inbox
// reading the legacy queue finds the id of its backfilled copy. Two messages
// identical in all of these are treated as one.
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
		field(HeaderValue(d.Headers[k]))
	}
	field(string(d.Body))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x80 // version 8
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	s := hex.EncodeToString(u[:])
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}

// HeaderValue is an AMQP header value as text: a string or []byte as it
// is, a timestamp in RFC 3339 (UTC, seconds), nil as "", anything else as
// JSON. It is both the NATS header the backfill writes and what DeriveID
// hashes.
func HeaderValue(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case nil:
		return ""
	default:
		if b, err := json.Marshal(inUTC(x)); err == nil {
			return string(b)
		}
		return fmt.Sprint(x)
	}
}

// inUTC is v with the timestamps nested in its tables and arrays in UTC:
// amqp091-go decodes them to local time, and the id must not depend on the
// host's time zone.
func inUTC(v any) any {
	switch x := v.(type) {
	case time.Time:
		return x.UTC()
	case amqp.Table:
		if x == nil {
			return v
		}
		out := make(amqp.Table, len(x))
		for k, e := range x {
			out[k] = inUTC(e)
		}
		return out
	case map[string]any:
		if x == nil {
			return v
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = inUTC(e)
		}
		return out
	case []any:
		if x == nil { // an empty AMQP array: JSON null, as before
			return v
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = inUTC(e)
		}
		return out
	}
	return v
}
