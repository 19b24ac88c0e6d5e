package relay

import (
	"errors"
	"fmt"
	"time"
)

var errNoTarget = errors.New("no target reachable")

// active reports which of the enabled targets may be published to now:
// their sink is ready and their breaker closed.
func (r *Relay) active(now time.Time, enabled phase) (act phase, any bool) {
	for _, t := range enabled.targets() {
		if r.sinks.Get(t).Ready() == nil && r.breaker.Get(t).allow(now) {
			act.Set(t, true)
		}
	}
	return act, act.Any()
}

// Unready says, for each enabled target that is not ready, why: its
// broker connection is down, or the relay paused it because every publish
// of its last batches failed for want of the broker; and, while a relay
// that follows has not read the table's phase, that. Empty means ready.
// Safe for concurrent use; /readyz uses it.
func (r *Relay) Unready() []string {
	var out []string
	select {
	case <-r.phase.read:
	default: // workers claim nothing yet (followPhase)
		out = append(out, "phase: the table's phase not read from Postgres yet: not claiming")
	}
	for _, t := range r.phase.now().targets() {
		if why := r.pausedBy(t); why != "" {
			out = append(out, fmt.Sprintf("%s: %s", t, why))
		}
	}
	return out
}

// Paused returns the enabled targets the relay publishes nothing to now:
// their broker connection is down, or every publish of their last batches
// failed for want of the broker. Safe for concurrent use; the
// relayd_target_paused gauge reads it.
func (r *Relay) Paused() []Target {
	var out []Target
	for _, t := range r.phase.now().targets() {
		if r.pausedBy(t) != "" {
			out = append(out, t)
		}
	}
	return out
}

// pausedBy says why target t is paused, or "".
func (r *Relay) pausedBy(t Target) string {
	if err := r.sinks.Get(t).Ready(); err != nil {
		return err.Error()
	}
	if n, last := r.breaker.Get(t).failing(time.Now(), r.cfg.PublishTimeout+r.cfg.PollInterval+time.Second); n > 0 {
		return fmt.Sprintf("paused after %d failed batch(es) in a row: %s", n, last)
	}
	return ""
}

// nextTargetCheck is how long to wait before looking at the targets again
// when none is active.
func (r *Relay) nextTargetCheck() time.Duration {
	d := r.cfg.PollInterval
	for _, t := range r.phase.now().targets() {
		if w := r.breaker.Get(t).wait(time.Now()); w > 0 && w < d {
			d = w
		}
	}
	return min(d, 250*time.Millisecond)
}
