package relay

import (
	"context"
	"errors"
	"time"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/errlog"
)

// batchRetry is a worker's backoff after a failed batch.
var batchRetry = backoff.Doubling{Floor: 100 * time.Millisecond, Cap: 30 * time.Second, Jitter: 0.5}

// work is one worker's loop: batches back to back while they come back
// full, else wait for a wake-up or the poll interval (docs/design.md, "The
// worker loop and kicks").
func (r *Relay) work(ctx context.Context, id int) {
	log := r.log.With("worker", id)
	errs := errlog.New(log, "relay batch")
	w := r.idle.join()
	defer w.leave()
	wait := time.Duration(0)
	for ctx.Err() == nil {
		// Taken before the batch: a reconnection while it fails still
		// ends the stall after it.
		reconnected := r.reconnected.wait()
		start := time.Now()
		res, err := r.runBatch(ctx, w)
		if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
			return // stopping: a claim cut short is not a failure to report
		}
		took := time.Since(start)
		switch {
		case err == nil:
			errs.OK()
			wait = 0
		case errors.Is(err, errNoTarget):
			// Every enabled broker is down: wait for the first to come back.
			r.stall(ctx, w, reconnected, r.nextTargetCheck())
			continue
		default:
			errs.Error(err)
			wait = batchRetry.Next(wait)
			r.stall(ctx, w, reconnected, batchRetry.Wait(wait))
			continue
		}
		if res.n >= max(1, r.cfg.BatchSize/2) {
			// Drain: there is probably more, for another worker too (keyed
			// rows come at most BatchSize/2 a batch).
			r.drain.signal()
			continue
		}
		if res.keyed > 0 {
			// The batch's keys are free again, and no NOTIFY says so.
			continue
		}
		if r.floor.sweepDue(time.Now()) {
			continue // rows below the floor are owed a walk now, not at the poll
		}
		if res.n == 0 && took > 5*time.Millisecond && !res.belowFloor {
			// An empty claim that took long walked past rows it may not
			// take: do not repeat that walk on every NOTIFY.
			backoff.Sleep(ctx, 2*took)
		}
		r.idleWait(ctx, w, res.n == 0)
	}
}

// stall waits d, or until reconnected is closed (the listener reconnected
// to Postgres), with w stalled: the listener does not count it as waiting
// for rows.
func (r *Relay) stall(ctx context.Context, w *worker, reconnected <-chan struct{}, d time.Duration) {
	w.set(workerStalled)
	t := time.NewTimer(d)
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-reconnected:
	}
	t.Stop()
	w.set(workerFree)
}

// idleWait waits for a NOTIFY, the poll interval, or — unless empty (the
// worker's claim found nothing) — another worker's full batch.
func (r *Relay) idleWait(ctx context.Context, w *worker, empty bool) {
	drain := r.drain
	if empty {
		drain = nil
	}
	t := time.NewTimer(r.cfg.PollInterval)
	defer t.Stop()
	w.waiting()
	select {
	case <-ctx.Done():
	case <-r.wake:
	case <-drain:
	case <-t.C:
	}
}
