package relay

import (
	"context"
	"time"

	"github.com/relayd/relayd/internal/backoff"
)

// lateConfirm is a message a target confirmed after its batch gave up.
type lateConfirm struct {
	target Target
	msgID  string
}

// lateBuffer is how many late confirms wait to be recorded at most.
const lateBuffer = 1 << 14

// onLateConfirm returns the callback target t's sink calls, from its own
// goroutine, with a late confirm: it queues the confirm for recordLate, or
// drops it when the queue is full (only other instances may publish it again).
func (r *Relay) onLateConfirm(t Target) func(msgID string) {
	return func(msgID string) {
		select {
		case r.lateConfirms <- lateConfirm{target: t, msgID: msgID}:
		default:
		}
	}
}

// recordLate records late confirms as deliveries, in sets of what has
// queued up: until then another instance retrying the row would publish a
// second copy. After stop it records what is still queued and returns.
func (r *Relay) recordLate(stop <-chan struct{}) {
	sctx, cancel := afterStop(stop, lateStopGrace)
	defer cancel()
	for {
		var first lateConfirm
		stopping := false
		select {
		case <-stop:
			stopping = true
		case first = <-r.lateConfirms:
		}
		var byTarget perTarget[[]string]
		add := func(c lateConfirm) { p := byTarget.Ptr(c.target); *p = append(*p, c.msgID) }
		if !stopping {
			add(first)
		}
	more:
		for n := 1; n < 1000 || stopping; n++ {
			select {
			case c := <-r.lateConfirms:
				add(c)
			default:
				break more
			}
		}
		byTarget.Each(func(t Target, ids []string) {
			if len(ids) > 0 {
				r.recordLateSet(sctx, t, ids, stopping)
			}
		})
		if stopping {
			return
		}
	}
}

// lateStopGrace is how long a record of late confirms may go on once the
// relay stops: one under way then (a Postgres that does not answer) would
// otherwise hold Run past RELAY_SHUTDOWN_TIMEOUT.
const lateStopGrace = 5 * time.Second

// recordLateSet records one set, three tries in all (one when stopping);
// sctx ends lateStopGrace after the relay stops.
func (r *Relay) recordLateSet(sctx context.Context, t Target, ids []string, stopping bool) {
	for attempt := 1; ; attempt++ {
		// A row a batch in flight holds stays locked for up to the batch's
		// publish timeout and its record.
		lockWait := r.cfg.PublishTimeout + 30*time.Second
		limit := lockWait + 30*time.Second
		if stopping {
			limit = lateStopGrace // the process is on its way out
		}
		ctx, cancel := context.WithTimeout(sctx, limit)
		n, moved, err := r.store.recordLate(ctx, r.pool, t, ids, r.phase.now(), lockWait, r.cfg.Routes)
		cancel()
		if err == nil {
			if moved >= 0 {
				r.floor.movedToOwed(moved)
			}
			r.cfg.Metrics.LateConfirmed(t, len(ids))
			r.log.Info("late confirms recorded", "target", string(t), "confirms", len(ids), "rows_marked", n)
			return
		}
		if attempt == 3 || stopping || sctx.Err() != nil {
			r.log.Warn("late confirms not recorded: another instance may publish these rows again",
				"target", string(t), "confirms", len(ids), "error", err.Error())
			return
		}
		backoff.Sleep(sctx, time.Second)
	}
}

// afterStop returns a context that ends grace after stop is closed.
func afterStop(stop <-chan struct{}, grace time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
			return
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
