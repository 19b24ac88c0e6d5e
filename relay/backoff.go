package relay

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayd/relayd/internal/backoff"
)

// retryBackoff is the wait before a row's next attempt on a target:
// RetryMin·2^(attempt-1), capped at RetryMax, jittered to 50–100%.
func (r *Relay) retryBackoff(attempt int32) time.Duration {
	b := backoff.Doubling{Floor: r.cfg.RetryMin, Cap: r.cfg.RetryMax, Jitter: 0.5}
	return b.Wait(b.Attempt(int(attempt)))
}

// outageBackoff is the wait before a row whose publish failed for want of
// the broker (ErrUnavailable, ErrOutOfRoom) is tried again on target t.
func (r *Relay) outageBackoff(t Target, c *claimed, err error, now time.Time) time.Duration {
	if waits(err) {
		return r.roomBackoff(now.Sub(r.outOfRoomSince.refused(t, c.msg.Topic, now, 2*r.cfg.RetryMax)))
	}
	d := r.retryBackoff(c.attempts.Get(t) + 1)
	if b := r.retryBound.Get(t); b > 0 {
		// It may have been stored: again within the broker's dedupe window.
		d = min(d, b)
	}
	if errors.Is(err, ErrAwaitingConfirm) {
		// Its confirm may still come: leave recordLate the time to record
		// it before any instance publishes the row again.
		d = max(d, r.cfg.PublishTimeout)
	}
	return d
}

// roomBackoff is the wait before a row refused for want of room goes
// again, its topic refused for `refused`: half that, within RetryMin and
// RetryMax, jittered to 50–100% (not an attempt: it grows with the refusal).
func (r *Relay) roomBackoff(refused time.Duration) time.Duration {
	return jitter(min(max(refused/2, r.cfg.RetryMin), r.cfg.RetryMax))
}

// jitter takes up to half off d at random.
func jitter(d time.Duration) time.Duration {
	return backoff.Doubling{Jitter: 0.5}.Wait(d)
}

// roomRefusals is, per target and topic, since when the broker refuses rows
// for want of room, until it stores one. Workers write it as they settle
// rows (docs/design.md, "Backoff and room").
type roomRefusals struct {
	n        atomic.Int32 // the runs in every map: a delivery skips the lock while it is 0
	mu       sync.Mutex   // guards runs and lastDrop
	runs     perTarget[map[string]refusalRun]
	lastDrop time.Time // when dropEnded last walked the maps
}

// refusalRun is one topic's refusals: the first and the latest. A run with
// no refusal for longer than refused's stale argument is over.
type refusalRun struct{ since, last time.Time }

// maxRefusedTopics bounds the topics remembered; past it (after dropping the
// runs that are over), a refusal counts from now.
const maxRefusedTopics = 10000

// refused notes a refusal of topic by target t at now, and returns since
// when its refusals run.
func (f *roomRefusals) refused(t Target, topic string, now time.Time, stale time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.runs.Get(t)
	if m == nil {
		m = map[string]refusalRun{}
		f.runs.Set(t, m)
	}
	run, ok := m[topic]
	switch {
	case ok && now.Sub(run.last) <= stale:
		run.last = now
	case ok:
		run = refusalRun{since: now, last: now}
	case int(f.n.Load()) >= maxRefusedTopics:
		f.dropEnded(now, stale)
		if int(f.n.Load()) >= maxRefusedTopics {
			return now
		}
		run = refusalRun{since: now, last: now}
		f.n.Add(1)
	default:
		run = refusalRun{since: now, last: now}
		f.n.Add(1)
	}
	m[topic] = run
	return run.since
}

// dropEnded drops the runs that are over, both targets', at most once a
// second (it walks every entry). Called with mu held.
func (f *roomRefusals) dropEnded(now time.Time, stale time.Duration) {
	if now.Sub(f.lastDrop) < time.Second {
		return
	}
	f.lastDrop = now
	f.runs.Each(func(_ Target, m map[string]refusalRun) {
		for topic, r := range m {
			if now.Sub(r.last) > stale {
				delete(m, topic)
				f.n.Add(-1)
			}
		}
	})
}

// stored ends the refusals of topic by target t.
func (f *roomRefusals) stored(t Target, topic string) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.runs.Get(t)
	if _, ok := m[topic]; ok {
		delete(m, topic)
		f.n.Add(-1)
	}
}
