package headers

import (
	"fmt"
	"strconv"
	"strings"
)

// AMQPProperty is an AMQP basic property a message sets with a header: the
// relay's RabbitMQ sink moves the header into the property, and backfill
// moves the property back into the header (package amqpprop), so that a
// message is the same whichever way it reached a broker.
type AMQPProperty struct {
	Header string   // the header's name, AMQP's own spelling; matched in any case
	Field  string   // the field of amqp091-go's Publishing and Delivery
	Kind   AMQPKind // what values it takes
}

// AMQPKind is what values an AMQP property takes, as a header's string.
type AMQPKind int

const (
	// ShortString is any string of at most 255 bytes.
	ShortString AMQPKind = iota
	// Octet is a decimal from 0 to 255.
	Octet
	// Milliseconds is a decimal from 0 to 4294967295: RabbitMQ closes the
	// channel on an expiration that is not one (PRECONDITION_FAILED).
	Milliseconds
)

// AMQPProperties are the properties a message sets through its headers, the
// one list of them. delivery-mode is not one (the relay publishes
// persistent), nor are message-id and timestamp (the row's message_id and
// created_at): headers of those names stay headers.
var AMQPProperties = []AMQPProperty{
	{"content-type", "ContentType", ShortString},
	{"content-encoding", "ContentEncoding", ShortString},
	{"correlation-id", "CorrelationId", ShortString},
	{"reply-to", "ReplyTo", ShortString},
	{"expiration", "Expiration", Milliseconds},
	{"priority", "Priority", Octet},
	{"type", "Type", ShortString},
	{"user-id", "UserId", ShortString},
	{"app-id", "AppId", ShortString},
}

// AMQPPropertyIndex is the index in AMQPProperties of the property header
// k sets, or -1. Content-Type sets content-type as content-type does.
func AMQPPropertyIndex(k string) int {
	for i, p := range AMQPProperties {
		// The length first: most headers are none, and EqualFold does not check it.
		if len(k) == len(p.Header) && strings.EqualFold(k, p.Header) {
			return i
		}
	}
	return -1
}

// IsAMQPProperty says whether header k sets an AMQP property.
func IsAMQPProperty(k string) bool { return AMQPPropertyIndex(k) >= 0 }

// maxShortString is AMQP 0-9-1's limit on a short string: a field-table key,
// and every string property.
const maxShortString = 255

// maxMilliseconds is the largest expiration every RabbitMQ version takes
// (MAX_EXPIRY_TIMER, an Erlang timer's limit); some take more.
const maxMilliseconds = 1<<32 - 1

// Reason says why p cannot take v, or "". An empty v is taken: it sets
// nothing, as amqp091-go sends an empty property as none.
func (p AMQPProperty) Reason(v string) string {
	if len(v) > maxShortString {
		return fmt.Sprintf("%d bytes: as an AMQP property it takes at most %d", len(v), maxShortString)
	}
	if v == "" {
		return ""
	}
	switch p.Kind {
	case Octet:
		if _, err := strconv.ParseUint(v, 10, 8); err != nil {
			return fmt.Sprintf("%q: an AMQP %s is a decimal from 0 to 255", v, p.Header)
		}
	case Milliseconds:
		if _, err := strconv.ParseUint(v, 10, 32); err != nil {
			return fmt.Sprintf("%q: RabbitMQ takes an %s in milliseconds, a decimal from 0 to %d, and closes the channel on anything else",
				v, p.Header, maxMilliseconds)
		}
	}
	return ""
}

// AMQPReason says why RabbitMQ cannot take header k with value v, or "": a
// key over 255 bytes, or a value the property k sets cannot take (Reason).
// amqp091-go finds out about a short string over 255 bytes only while
// writing the frames, and closes the whole connection; RabbitMQ closes the
// channel on a bad expiration. Either fails every publish in flight on it.
func AMQPReason(k, v string) string {
	if len(k) > maxShortString {
		return fmt.Sprintf("key %.20q… is %d bytes: AMQP takes at most %d", k, len(k), maxShortString)
	}
	if i := AMQPPropertyIndex(k); i >= 0 {
		if r := AMQPProperties[i].Reason(v); r != "" {
			return fmt.Sprintf("value of %q is %s", k, r)
		}
	}
	return ""
}

// AMQPUserIDReason is why the RabbitMQ sink parks a message whose user-id
// is id: not user, the user it connects as ("" when it cannot tell).
func AMQPUserIDReason(id, user string) string {
	const why = "RabbitMQ closes the channel on a user-id other than the connection's user"
	if user == "" {
		return fmt.Sprintf("user-id %q: relayd connects with a certificate (EXTERNAL) and cannot tell its user name, and %s", id, why)
	}
	return fmt.Sprintf("user-id %q is not %q, the user relayd connects as: %s", id, user, why)
}
