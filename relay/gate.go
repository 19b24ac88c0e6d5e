package relay

import (
	"errors"
	"fmt"
	"time"
)

var errNoTarget = errors.New("no target reachable")

// active reports which enabled targets may be published to now: their
// sink is ready and their breaker closed.
func (r *Relay) active(now time.Time) (act [2]bool, any bool) {
	for i := range Targets {
		if r.enabled[i] && r.sinks[i].Ready() == nil && r.breaker[i].allow(now) {
			act[i], any = true, true
		}
	}
	return act, any
}

// Unready says, for each enabled target that is not ready, why: its
// broker connection is down, or the relay paused it because every publish
// of its last batches failed for want of the broker. Empty means every
// target is ready. Safe for concurrent use; /readyz uses it.
func (r *Relay) Unready() []string {
	var out []string
	for i, t := range Targets {
		if !r.enabled[i] {
			continue
		}
		if err := r.sinks[i].Ready(); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", t, err))
			continue
		}
		if n, last := r.breaker[i].failing(time.Now(), r.cfg.PublishTimeout+r.cfg.PollInterval+time.Second); n > 0 {
			out = append(out, fmt.Sprintf("%s: paused after %d failed batch(es) in a row: %s", t, n, last))
		}
	}
	return out
}

// nextTargetCheck is how long to wait before looking at the targets again
// when none is active.
func (r *Relay) nextTargetCheck() time.Duration {
	d := r.cfg.PollInterval
	for i := range Targets {
		if r.enabled[i] {
			if w := r.breaker[i].wait(time.Now()); w > 0 && w < d {
				d = w
			}
		}
	}
	return min(d, 250*time.Millisecond)
}
