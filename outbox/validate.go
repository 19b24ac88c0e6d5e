package outbox

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/relayd/relayd/internal/headers"
)

// ErrInvalidMessage matches, with errors.Is, every [ValidationError].
var ErrInvalidMessage = errors.New("invalid outbox message")

// ValidationError says which message of a batch is invalid and why.
type ValidationError struct {
	Index  int    // the message's position in the batch; -1 from ValidateTopic and ValidateHeaders
	Field  string // "id", "topic", "key", "headers" or "payload"
	Reason string
}

func (e *ValidationError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("%v: %s: %s", ErrInvalidMessage, e.Field, e.Reason)
	}
	return fmt.Sprintf("%v %d: %s: %s", ErrInvalidMessage, e.Index, e.Field, e.Reason)
}

// Is reports whether target is [ErrInvalidMessage].
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidMessage }

// maxTopicLen is the longest AMQP routing key (a short string).
const maxTopicLen = 255

// MaxKeyLen is the longest key, in bytes. The outbox's key indexes take an
// entry of at most about 2,700 bytes (a B-tree page's third), and a longer
// key would fail the INSERT, aborting the caller's transaction.
const MaxKeyLen = 1024

// relayHeaders is what the relay's own NATS headers add to a message, at
// most: Nats-Msg-Id (a UUID) and Nats-Expected-Stream (a stream name), with
// the headers' first and last lines when the message has none of its own.
const relayHeaders = 512

// ValidateTopic reports whether topic can be published as both an AMQP
// routing key and the suffix of a NATS subject: it must be 1 to 255 bytes of
// UTF-8, with no whitespace or control characters, no NATS wildcards ('*',
// '>') and no empty tokens (no leading or trailing '.', no ".."). The relay
// applies the same check to rows written with plain SQL. The error is a
// *[ValidationError] with Index -1.
func ValidateTopic(topic string) error {
	reason := topicReason(topic)
	if reason == "" {
		return nil
	}
	return &ValidationError{Index: -1, Field: "topic", Reason: reason}
}

func topicReason(topic string) string {
	switch {
	case topic == "":
		return "is empty"
	case len(topic) > maxTopicLen:
		return fmt.Sprintf("is %d bytes, more than %d", len(topic), maxTopicLen)
	case !utf8.ValidString(topic):
		return fmt.Sprintf("%q is not valid UTF-8", topic)
	}
	for _, r := range topic {
		switch {
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return fmt.Sprintf("%q contains whitespace or a control character", topic)
		case r == '*' || r == '>':
			return fmt.Sprintf("%q contains the NATS wildcard %q", topic, r)
		}
	}
	if topic[0] == '.' || topic[len(topic)-1] == '.' || strings.Contains(topic, "..") {
		return fmt.Sprintf("%q has an empty token (leading, trailing or double '.')", topic)
	}
	return ""
}

// ValidateHeaders reports whether h can be published as NATS and AMQP
// headers: keys must be what NATS takes (printable ASCII, no spaces, none of
// "()/,:;<=>?@[\]{} or the double quote), at most 255 bytes (an AMQP short
// string), and not start with "Nats-" in any case (those headers control
// JetStream; the relay sets Nats-Msg-Id from the message id); values must be UTF-8 with no '\r', '\n' or NUL, and
// what the AMQP property a header names takes (docs/consumers.md, "AMQP
// properties"); keys and values together at most [headers.MaxTotal] (64 KiB)
// bytes. The relay parks a row written with plain SQL whose headers a
// broker refuses, for that broker, with the reason. The error is a
// *[ValidationError] with Index -1.
func ValidateHeaders(h map[string]string) error {
	reason := headersReason(h)
	if reason == "" {
		return nil
	}
	return &ValidationError{Index: -1, Field: "headers", Reason: reason}
}

func headersReason(h map[string]string) string {
	// Sorted, so that the same map always gives the same error.
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if reason := headers.NATSKeyReason(k); reason != "" {
			return reason
		}
		if reason := headers.NATSReservedReason(k); reason != "" {
			return reason
		}
		v := h[k]
		switch {
		case !utf8.ValidString(v):
			return fmt.Sprintf("value of %q is not valid UTF-8", k)
		case strings.ContainsAny(v, "\r\n\x00"):
			return fmt.Sprintf("value of %q contains CR, LF or NUL", k)
		}
		if reason := headers.AMQPReason(k, v); reason != "" {
			return reason
		}
	}
	return headers.TotalReason(h)
}

// validate checks m; the error's Index is for the caller to set.
func (w *Writer) validate(m Message) *ValidationError {
	invalid := func(field, reason string) *ValidationError {
		return &ValidationError{Field: field, Reason: reason}
	}
	if m.ID != "" {
		if _, ok := parseUUID(m.ID); !ok {
			return invalid("id", fmt.Sprintf("%q is not a UUID in canonical form", m.ID))
		}
	}
	if r := topicReason(m.Topic); r != "" {
		return invalid("topic", r)
	}
	// Postgres text cannot hold these; caught here, they do not abort the
	// caller's transaction.
	if !utf8.ValidString(m.Key) || strings.IndexByte(m.Key, 0) >= 0 {
		return invalid("key", fmt.Sprintf("%q is not valid UTF-8 or contains NUL", m.Key))
	}
	if len(m.Key) > MaxKeyLen {
		return invalid("key", fmt.Sprintf("is %d bytes, more than %d", len(m.Key), MaxKeyLen))
	}
	if r := headersReason(m.Headers); r != "" {
		return invalid("headers", r)
	}
	switch {
	case m.Payload == nil:
		return invalid("payload", "is nil")
	case w.maxPayload > 0 && len(m.Payload)+headers.NATSSize(m.Headers)+relayHeaders > w.maxPayload:
		return invalid("payload", fmt.Sprintf("is %d bytes, with the headers %d, more than MaxPayload %d (less %d for the relay's own headers)",
			len(m.Payload), len(m.Payload)+headers.NATSSize(m.Headers), w.maxPayload, relayHeaders))
	}
	return nil
}
