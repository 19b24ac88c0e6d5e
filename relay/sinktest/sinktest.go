// Package sinktest is the conformance suite every relay.Sink must pass:
// publish and confirm, concurrent publishes, duplicates, broker down and
// broker back. The relay's delivery guarantees rest on the Sink contract
// (relay/sink.go); this suite checks it against the real broker, so a new
// sink, or a change to an old one, is held to the same behaviour.
//
// A sink's own tests call Run with a Harness that builds the sink against a
// broker of the test's own (its own exchange and queue, or stream), and a
// Broker that shows the suite what arrived and can take the broker away and
// bring it back.
package sinktest

import (
	"testing"

	"github.com/relayd/relayd/relay"
)

// TopicPrefix starts every topic the suite publishes. A harness must route
// every topic under it to where its Broker's Received looks (an AMQP queue
// bound with "sinktest.#"; a stream capturing the sink's subject prefix).
const TopicPrefix = "sinktest."

// Traceparent is the W3C trace header every suite message carries.
const Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// Delivery is one copy of a message as the test saw it at the broker.
type Delivery struct {
	Headers map[string]string // every header the broker has, the sink's own included
	Payload []byte
}

// Broker is the harness's view of the broker one sink publishes to.
type Broker interface {
	// Received returns every message seen at the broker for this test so
	// far: message id -> one Delivery per copy. A message that the broker
	// holds twice is listed twice. It must not block for long; the suite
	// polls it.
	Received(t *testing.T) map[string][]Delivery
	// Down makes the broker unreachable for the sink: live connections
	// drop and new ones are refused. It returns once that holds. It may
	// call t.Skip when this broker cannot be taken down (a shared server).
	Down(t *testing.T)
	// Up undoes Down: the broker listens on the same address again, with
	// the same data, and Up returns once it accepts publishes. Reconnecting
	// is the sink's business, not Up's.
	Up(t *testing.T)
}

// DuplicateCounter is implemented by a Broker that counts the duplicate
// acknowledgements its sink reported (natssink's OnDuplicate hook).
type DuplicateCounter interface {
	Duplicates() int
}

// Harness is what a sink's test gives the suite.
type Harness struct {
	// New returns a new sink, publishing to a broker of this test's own,
	// and that broker. It registers its own cleanup with t.Cleanup.
	// Required.
	New func(t *testing.T) (relay.Sink, Broker)
	// Dedupes says the broker stores a repeated MessageID once (JetStream
	// inside its duplicate window). When false (RabbitMQ), a repeat is
	// stored again, and the suite asserts exactly that.
	Dedupes bool
}
