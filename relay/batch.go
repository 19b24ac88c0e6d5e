package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/relayd/relayd/internal/outboxsql"
)

// batchResult is what a batch claimed, for the worker loop to choose its
// next step: how many rows, how many of them keyed.
type batchResult struct {
	n, keyed   int
	belowFloor bool // the claim was a sweep (floors.beside)
}

// runBatch claims, publishes and records one batch in two round trips. Once
// it holds rows it runs to the end whatever ctx does, under its own timeout.
func (r *Relay) runBatch(ctx context.Context, w *worker) (res batchResult, err error) {
	start := time.Now()
	enabled := r.phase.begin() // the batch finishes under the phase it was claimed in
	defer r.phase.end(enabled)
	act, ok := r.active(start, enabled)
	if !ok {
		return res, errNoTarget
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout+30*time.Second)
	defer cancel()
	// Until it holds rows, a batch stops with the relay: a shutdown does
	// not wait on a Postgres that does not answer.
	cctx, ccancel := context.WithCancel(bctx)
	defer ccancel()
	defer context.AfterFunc(ctx, ccancel)()
	conn, err := r.pool.Acquire(cctx)
	if err != nil {
		return res, fmt.Errorf("begin: %w", err)
	}
	var held []int64 // the batch's keyed rows, in r.held until its transaction ends
	// The outbox row the claims walk back to if the batch ends unrecorded:
	// its rows are claimable again, below the floor. -1: none.
	walkBack := int64(-1)
	defer func() {
		// A transaction still open (or failed) ends without a trace; a
		// connection that cannot roll back is closed on release.
		if conn.Conn().PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			conn.Exec(rctx, "ROLLBACK") //nolint:errcheck // see above
			cancel()
		}
		conn.Release()
		r.held.remove(held)
		// After the rollback, when the rows are free again (a closed
		// connection frees them a moment later: the recheck takes those).
		if walkBack >= 0 {
			r.floor.walkBack(walkBack)
		}
	}()

	// One claim at a time, each starting where the one before it ended; a
	// sweep below them runs beside them.
	fl := r.floor.begin(time.Now(), enabled)
	res.belowFloor = fl.beside()
	if res.belowFloor {
		// It may walk for a while: rows committed meanwhile wake another
		// worker (a busy one's producers do not notify), and one wakes now
		// for those this worker's next claim would have taken.
		w.set(workerFree)
		r.wake.signal()
		if !fl.oldest {
			r.hooks.onSweeping()
		}
	} else {
		w.claiming()
		r.hooks.onClaiming()
	}
	claimStart := time.Now()
	rows, snap, err := r.store.claim(cctx, conn, enabled, act, r.cfg.BatchSize, r.cfg.SkipParkedKeys, fl, r.held.list())
	claimedAt := time.Now()
	if err == nil {
		if r.floor.claimed(rows, fl, snap, claimedAt.Sub(claimStart)) {
			r.log.Warn("the database's transaction ids went back (a standby promoted without the last transactions, or a restore): " +
				"the claims walk the outbox from its oldest row again")
		}
		held = r.held.add(rows)
		if !res.belowFloor {
			r.hooks.onClaimed(len(rows), fl)
		}
	}
	r.floor.end(fl, err == nil)
	if err != nil {
		return res, err
	}
	if len(rows) > 0 {
		// Busy before its rows count as claimed: the listener reads the
		// state first, and would take the lock for a free worker's rows.
		w.set(workerBusy) // producers need not notify meanwhile
	}
	r.idle.claimed(rows)
	walkBack = lowestFresh(rows)
	if len(rows) == 0 {
		if _, err := conn.Exec(cctx, outboxsql.EmptyCommit); err != nil { // holds nothing: stops with the relay too
			return res, fmt.Errorf("commit empty claim: %w", err)
		}
		return res, nil
	}

	r.routeRows(rows)
	bt := r.tracer.startBatch(rows, claimStart, claimedAt)
	rec := r.publish(bctx, rows, enabled, bt)
	r.hooks.onAfterPublish()
	res.n, res.keyed = len(rows), len(held)
	if err := bt.record(len(rows), func() error { return r.store.record(bctx, conn, rec) }); err != nil {
		return res, err
	}
	walkBack = -1
	if id := movedToOwed(rows, rec); id >= 0 {
		r.floor.movedToOwed(id)
	}
	r.cfg.Metrics.Batch(time.Since(start), len(rows))
	return res, nil
}

// publish sends each row to the targets it wants, all targets at once, and
// returns the outcomes to record.
func (r *Relay) publish(ctx context.Context, rows []*claimed, enabled phase, bt *batchTrace) *batchRecord {
	results, done := r.fanOut(ctx, rows, bt)
	now := time.Now()
	for _, t := range Targets {
		if anyWanted(rows, t) {
			r.feedBreaker(t, rows, results.Get(t), now)
		}
	}
	rec := newBatchRecord(len(rows), enabled)
	for i, c := range rows {
		var outcome perTarget[outboxsql.Outcome]
		var errText perTarget[string]
		var backoff perTarget[time.Duration]
		for _, t := range Targets {
			err := results.Get(t)[i]
			if c.badRow != "" {
				err = &PermanentError{Reason: c.badRow}
			}
			*outcome.Ptr(t), *errText.Ptr(t), *backoff.Ptr(t) = r.settle(t, c, err, now)
			bt.end(i, t, outcome.Get(t), errText.Get(t), err, done.Get(t))
		}
		rec.add(c, outcome, errText, backoff)
	}
	return rec
}

// fanOut publishes each target's rows to its sink, the targets in parallel,
// and returns per target and row the sink's result, and per target when the
// sink returned. A traced row goes with its send span's traceparent.
func (r *Relay) fanOut(ctx context.Context, rows []*claimed, bt *batchTrace) (perTarget[[]error], perTarget[time.Time]) {
	var results perTarget[[]error]
	var done perTarget[time.Time]
	var wg sync.WaitGroup
	for _, t := range Targets {
		var msgs []*Message
		var idx []int
		for i, c := range rows {
			if c.want.Get(t) && c.badRow == "" {
				msgs = append(msgs, bt.message(i, t, c))
				idx = append(idx, i)
			}
		}
		out := make([]error, len(rows))
		results.Set(t, out)
		if len(msgs) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
			defer cancel()
			res := make([]error, len(msgs))
			bt.sent(t, time.Now())
			r.sinks.Get(t).Publish(pctx, msgs, res)
			done.Set(t, time.Now())
			for j, i := range idx {
				out[i] = res[j]
			}
		}()
	}
	wg.Wait()
	return results, done
}

// feedBreaker tells target t's breaker how its batch went: every publish
// failed for want of the broker pauses it; a delivery or a refusal for room
// (an answer) closes it.
func (r *Relay) feedBreaker(t Target, rows []*claimed, results []error, now time.Time) {
	attempted, unavailable, delivered, outOfRoom := 0, 0, 0, 0
	for i, c := range rows {
		if !c.want.Get(t) {
			continue
		}
		err := results[i]
		if c.badRow == "" && waits(err) {
			outOfRoom++
			continue
		}
		attempted++
		switch {
		case c.badRow != "":
		case err == nil:
			delivered++
		case errors.Is(err, ErrUnavailable):
			unavailable++
		}
	}
	b := r.breaker.Get(t)
	if attempted > 0 && unavailable == attempted {
		if d := b.failure(now, firstErr(results)); d > 0 {
			r.log.Warn("target unavailable, pausing it", "target", string(t), "for", d.String(), "error", firstErr(results))
		}
	} else if delivered+outOfRoom > 0 && b.success() {
		r.log.Info("target recovered", "target", string(t))
	}
}

// classify is the outcome to record for a row on a target (the outcome*
// codes): err is the publish's result, attempts the row's failed attempts
// before it, maxAttempts Config.MaxAttempts.
func classify(wanted bool, err error, attempts int32, maxAttempts int) outboxsql.Outcome {
	switch {
	case !wanted:
		return outcomeNone
	case err == nil:
		return outcomeDelivered
	case IsPermanent(err):
		return outcomeParked
	case waits(err), errors.Is(err, ErrUnavailable):
		// The broker, not the row: retry without using up attempts.
		return outcomeOutage
	case maxAttempts > 0 && attempts+1 >= int32(maxAttempts):
		return outcomeParked
	default:
		return outcomeRetry
	}
}

// settle classifies row c's result err on target t, reports it, and
// returns what to record: the outcome, its error text and the backoff.
func (r *Relay) settle(t Target, c *claimed, err error, now time.Time) (outcome outboxsql.Outcome, errText string, backoff time.Duration) {
	attempts := c.attempts.Get(t)
	outcome = classify(c.want.Get(t), err, attempts, r.cfg.MaxAttempts)
	switch outcome {
	case outcomeDelivered:
		r.outOfRoomSince.stored(t, c.msg.Topic)
		r.cfg.Metrics.Published(t, c.msg.CreatedAt)
	case outcomeParked:
		errText = err.Error()
		if !IsPermanent(err) {
			errText = fmt.Sprintf("gave up after %d attempts: %v", attempts+1, err)
			r.cfg.Metrics.PublishFailed(t, err)
		}
		r.cfg.Metrics.Parked(t)
		r.log.Warn("row parked", "target", string(t), "id", c.msg.ID, "message_id", c.msg.MessageID, "reason", errText)
	case outcomeOutage:
		errText, backoff = err.Error(), r.outageBackoff(t, c, err, now)
		r.cfg.Metrics.PublishFailed(t, err)
	case outcomeRetry:
		errText, backoff = err.Error(), r.retryBackoff(attempts+1)
		r.cfg.Metrics.PublishFailed(t, err)
	}
	return outcome, errText, backoff
}

func anyWanted(rows []*claimed, t Target) bool {
	for _, c := range rows {
		if c.want.Get(t) {
			return true
		}
	}
	return false
}

func firstErr(errs []error) string {
	for _, e := range errs {
		if e != nil {
			return e.Error()
		}
	}
	return ""
}

// movedToOwed is the lowest of the outbox's unkeyed rows in rows that rec
// leaves owed, so moves to the owed table, or -1: none.
func movedToOwed(rows []*claimed, rec *batchRecord) int64 {
	owed := make(map[int64]bool, len(rec.ids))
	for _, id := range rec.ids {
		owed[id] = true
	}
	low := int64(-1)
	for _, c := range rows {
		if c.fresh && !c.msg.HasKey && owed[c.msg.ID] && (low < 0 || c.msg.ID < low) {
			low = c.msg.ID
		}
	}
	return low
}

// lowestFresh is the lowest of the outbox's unkeyed rows in rows, or -1:
// none.
func lowestFresh(rows []*claimed) int64 {
	low := int64(-1)
	for _, c := range rows {
		if c.fresh && !c.msg.HasKey && (low < 0 || c.msg.ID < low) {
			low = c.msg.ID
		}
	}
	return low
}
