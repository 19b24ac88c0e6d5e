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
		return r.roomBackoff(now.Sub(r.full.refused(t, c.msg.Topic, now, 2*r.cfg.RetryMax)))
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

// fullSince is, per target and topic, since when the broker refuses rows
// for want of room, until it stores one; a run with no refusal for stale is
// over (docs/design.md, "Backoff and room").
type fullSince struct {
	n     atomic.Int32 // entries, so that a delivery reads no map while none is full
	mu    sync.Mutex
	since perTarget[map[string]fullRun]
	swept time.Time // the last sweep of runs that are over (at the bound)
}

type fullRun struct{ since, last time.Time }

// maxFullTopics bounds the topics remembered; past it (after dropping the
// runs that are over), a refusal counts from now.
const maxFullTopics = 10000

// refused notes a refusal of topic by target t at now, and returns since
// when its refusals run.
func (f *fullSince) refused(t Target, topic string, now time.Time, stale time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.since.Get(t)
	if m == nil {
		m = map[string]fullRun{}
		f.since.Set(t, m)
	}
	run, ok := m[topic]
	switch {
	case ok && now.Sub(run.last) <= stale:
		run.last = now
	case ok:
		run = fullRun{since: now, last: now}
	case int(f.n.Load()) >= maxFullTopics:
		f.sweep(now, stale)
		if int(f.n.Load()) >= maxFullTopics {
			return now
		}
		run = fullRun{since: now, last: now}
		f.n.Add(1)
	default:
		run = fullRun{since: now, last: now}
		f.n.Add(1)
	}
	m[topic] = run
	return run.since
}

// sweep drops the runs that are over, both targets', at most once a second
// (it walks every entry). Called with mu held.
func (f *fullSince) sweep(now time.Time, stale time.Duration) {
	if now.Sub(f.swept) < time.Second {
		return
	}
	f.swept = now
	f.since.Each(func(_ Target, m map[string]fullRun) {
		for topic, r := range m {
			if now.Sub(r.last) > stale {
				delete(m, topic)
				f.n.Add(-1)
			}
		}
	})
}

// stored ends the refusals of topic by target t.
func (f *fullSince) stored(t Target, topic string) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.since.Get(t)
	if _, ok := m[topic]; ok {
		delete(m, topic)
		f.n.Add(-1)
	}
}
