// Package headers holds what each broker accepts in a message's headers, for
// the outbox package (a producer learns at insert time) and for the sinks (a
// row written with plain SQL is parked for the broker that refuses it, with
// the reason, rather than retried for ever).
package headers

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// natsForbidden are the printable ASCII characters nats.go refuses in a
// header key (isHeaderKeyValid); it takes 33–126 but these.
const natsForbidden = "\"()/,:;<=>?@[\\]{}"

// NATSKeyReason says why NATS refuses k as a header key, or "". nats.go
// refuses the whole message (ErrBadHeaderMsg) for one such key.
func NATSKeyReason(k string) string {
	if k == "" {
		return "empty key"
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 33 || c > 126 || strings.IndexByte(natsForbidden, c) >= 0 {
			return fmt.Sprintf("key %q: NATS takes printable ASCII without spaces or any of %s", k, natsForbidden)
		}
	}
	return ""
}

// NATSReservedReason says why k may not be set by a message, or "": the
// Nats- headers tell JetStream what to do with a publish (Nats-Rollup purges
// a subject, Nats-Expected-* make it conditional, Nats-TTL expires it) and
// the relay sets the ones it uses, Nats-Msg-Id above all.
func NATSReservedReason(k string) string {
	if len(k) >= 5 && strings.EqualFold(k[:5], "nats-") {
		return fmt.Sprintf("key %q is reserved: Nats- headers control JetStream, and the relay sets Nats-Msg-Id from the message id", k)
	}
	return ""
}

// MaxTotal is the most bytes of keys and values a message's headers may
// take, all together, as package outbox takes them: well inside RabbitMQ's
// default frame_max (128 KiB; amqp091-go puts all the properties in one
// frame, and RabbitMQ closes the connection on a larger one) and NATS's
// max_payload (1 MiB, headers and payload together).
const MaxTotal = 64 << 10

// TotalReason says why h's headers are too large all together, or "".
func TotalReason(h map[string]string) string {
	n := 0
	for k, v := range h {
		n += len(k) + len(v)
	}
	if n > MaxTotal {
		return fmt.Sprintf("keys and values take %d bytes, more than %d", n, MaxTotal)
	}
	return ""
}

// NATSSize is how many bytes h adds to a NATS message as nats.go writes it
// and the server counts it against max_payload: "NATS/1.0", a "key: value"
// line each, a blank line.
func NATSSize(h map[string]string) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n\r\n")
	for k, v := range h {
		n += len(k) + len(": \r\n") + len(v)
	}
	return n
}

// First is reason's verdict on the first of h's headers it refuses, in key
// order (the same row always gives the same reason), or "".
func First[V any](h map[string]V, reason func(k string, v V) string) string {
	bad := false
	for k, v := range h {
		if reason(k, v) != "" {
			bad = true
			break
		}
	}
	if !bad {
		return "" // the common case: no sort, no allocation
	}
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if r := reason(k, h[k]); r != "" {
			return r
		}
	}
	return ""
}
