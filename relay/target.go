package relay

import (
	"errors"
	"fmt"
	"strings"
)

// Target names a broker the relay publishes to. It is also the prefix of the
// target's delivery columns in the outbox table and the value of the
// `target` metric label.
type Target string

// The targets. Their order is the order of the RELAY_TARGETS phases.
const (
	TargetAMQP Target = "amqp" // the legacy RabbitMQ exchange
	TargetNATS Target = "nats" // the new JetStream stream
)

// Targets lists every target the relay knows, in a fixed order.
var Targets = []Target{TargetAMQP, TargetNATS}

func knownTarget(t Target) bool { return t == TargetAMQP || t == TargetNATS }

// ParseTargets parses a comma-separated RELAY_TARGETS value: a non-empty set
// of known targets, each at most once.
func ParseTargets(s string) ([]Target, error) {
	if s == "" {
		return nil, errors.New("empty: want amqp, nats or amqp,nats")
	}
	var seen perTarget[bool]
	for _, part := range strings.Split(s, ",") {
		part = strings.Trim(part, " ")
		t := Target(part)
		if !knownTarget(t) {
			return nil, fmt.Errorf("unknown target %q: want amqp, nats or amqp,nats", part)
		}
		if seen.Get(t) {
			return nil, fmt.Errorf("target %q given twice", part)
		}
		seen.Set(t, true)
	}
	return phase{seen}.targets(), nil // canonical order
}

// perTarget holds one T for each target.
type perTarget[T any] struct{ AMQP, NATS T }

// Ptr points at t's value. t must be a known target.
func (p *perTarget[T]) Ptr(t Target) *T {
	switch t {
	case TargetAMQP:
		return &p.AMQP
	case TargetNATS:
		return &p.NATS
	}
	panic("relay: unknown target " + string(t))
}

func (p perTarget[T]) Get(t Target) T     { return *p.Ptr(t) }
func (p *perTarget[T]) Set(t Target, v T) { *p.Ptr(t) = v }

// appendTo appends v to p's slice for t.
func appendTo[T any](p *perTarget[[]T], t Target, v T) {
	s := p.Ptr(t)
	*s = append(*s, v)
}

// Each calls f for every target, in the order of Targets.
func (p perTarget[T]) Each(f func(Target, T)) {
	f(TargetAMQP, p.AMQP)
	f(TargetNATS, p.NATS)
}

// phase is a set of targets: the enabled ones (the RELAY_TARGETS phase), or
// those a batch may publish to now.
type phase struct{ perTarget[bool] }

// Has reports whether t is in the set.
func (p phase) Has(t Target) bool { return p.Get(t) }

// Any reports whether the set has a target.
func (p phase) Any() bool { return p.AMQP || p.NATS }

// covers reports whether p enables every target q does.
func (p phase) covers(q phase) bool { return (p.AMQP || !q.AMQP) && (p.NATS || !q.NATS) }

// NATSOnly reports whether JetStream is the only target.
func (p phase) NATSOnly() bool { return p.NATS && !p.AMQP }

// targets lists the set's targets in the order of Targets.
func (p phase) targets() []Target {
	var out []Target
	p.Each(func(t Target, in bool) {
		if in {
			out = append(out, t)
		}
	})
	return out
}
