package relay

import (
	"context"
	"time"
)

// lateConfirm is a message a target confirmed after its batch gave up.
type lateConfirm struct {
	ti    int
	msgID string
}

// lateBuffer is how many late confirms wait to be recorded at most.
const lateBuffer = 1 << 14

// onLateConfirm queues a late confirm of target ti for recordLate. A full
// queue drops it: this instance still knows (the sink does not publish it
// again); only other instances may.
func (r *Relay) onLateConfirm(ti int) func(msgID string) {
	return func(msgID string) {
		select {
		case r.late <- lateConfirm{ti: ti, msgID: msgID}:
		default:
		}
	}
}

// recordLate records late confirms as deliveries as they come, in sets of
// what has queued up: until then only this instance knows the broker has
// the row, and another one retrying it would publish a second copy. After
// stop (the batches have finished) it records what is still queued and
// returns.
func (r *Relay) recordLate(stop <-chan struct{}) {
	for {
		var first lateConfirm
		stopping := false
		select {
		case <-stop:
			stopping = true
		case first = <-r.late:
		}
		byTarget := [2][]string{}
		if !stopping {
			byTarget[first.ti] = append(byTarget[first.ti], first.msgID)
		}
	more:
		for n := 1; n < 1000 || stopping; n++ {
			select {
			case c := <-r.late:
				byTarget[c.ti] = append(byTarget[c.ti], c.msgID)
			default:
				break more
			}
		}
		for ti, ids := range byTarget {
			if len(ids) > 0 {
				r.recordLateSet(ti, ids, stopping)
			}
		}
		if stopping {
			return
		}
	}
}

// recordLateSet records one set, three tries in all (one when stopping).
func (r *Relay) recordLateSet(ti int, ids []string, stopping bool) {
	for attempt := 1; ; attempt++ {
		// A row a batch in flight holds stays locked for up to the batch's
		// publish timeout and its record.
		lockWait := r.cfg.PublishTimeout + 30*time.Second
		limit := lockWait + 30*time.Second
		if stopping {
			limit = 5 * time.Second // the process is on its way out
		}
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		n, err := r.store.recordLate(ctx, r.pool, ti, ids, r.enabled, lockWait)
		cancel()
		if err == nil {
			r.cfg.Metrics.LateConfirmed(Targets[ti], len(ids))
			r.log.Info("late confirms recorded", "target", string(Targets[ti]), "confirms", len(ids), "rows_marked", n)
			return
		}
		if attempt == 3 || stopping {
			r.log.Warn("late confirms not recorded: another instance may publish these rows again",
				"target", string(Targets[ti]), "confirms", len(ids), "error", err.Error())
			return
		}
		time.Sleep(time.Second)
	}
}
