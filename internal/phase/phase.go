// Package phase holds the migration phase that every relay of an outbox
// shares: one row beside the table, its history, and the running relays'
// reports of the phase each is in (docs/migration.md, "The phases").
package phase

import (
	"fmt"
	"slices"
	"strings"

	"github.com/relayd/relayd/relay"
)

// Name is a phase of the move: which targets a row must reach.
type Name string

// The phases, in the order of the move.
const (
	AMQP Name = "amqp" // the legacy RabbitMQ exchange only
	Dual Name = "dual" // both: dual write
	NATS Name = "nats" // the JetStream stream only
)

// Names lists the phases in order.
var Names = []Name{AMQP, Dual, NATS}

// Parse reads a phase: amqp, dual or nats, or a RELAY_TARGETS value
// (amqp,nats is dual).
func Parse(s string) (Name, error) {
	switch n := Name(strings.TrimSpace(s)); n {
	case AMQP, Dual, NATS:
		return n, nil
	}
	targets, err := relay.ParseTargets(s)
	if err != nil {
		return "", fmt.Errorf("phase %q: want amqp, dual or nats", s)
	}
	return Of(targets), nil
}

// Of is the phase of a set of targets (a non-empty one).
func Of(targets []relay.Target) Name {
	amqp, nats := slices.Contains(targets, relay.TargetAMQP), slices.Contains(targets, relay.TargetNATS)
	switch {
	case amqp && nats:
		return Dual
	case nats:
		return NATS
	}
	return AMQP
}

// Targets lists the phase's targets, in the order of relay.Targets.
func (n Name) Targets() []relay.Target {
	switch n {
	case AMQP:
		return []relay.Target{relay.TargetAMQP}
	case NATS:
		return []relay.Target{relay.TargetNATS}
	}
	return []relay.Target{relay.TargetAMQP, relay.TargetNATS}
}

// Step is the phase's number in the migration runbook (docs/migration.md):
// 0 legacy only, 1 dual write, 4 new only.
func (n Name) Step() int {
	switch n {
	case AMQP:
		return 0
	case NATS:
		return 4
	}
	return 1
}
