package replay

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/phase"
)

// choose sets the run to do: the unfinished one (resumed: its window, from
// its position) when the request is empty or the same, else a new run of the
// requested window, recorded before anything is sent. It returns the time
// past which the read stops (zero: none).
func (r *runner) choose(ctx context.Context, stream jetstream.Stream) (end time.Time, err error) {
	history, err := phase.History(ctx, r.cfg.DB, r.cfg.Table)
	if err != nil {
		return time.Time{}, err
	}
	unfinished, ok, err := r.rec.unfinished(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if ok && !r.cfg.Restart {
		if !r.cfg.Request.IsZero() {
			w, err := Plan(r.cfg.Request, history)
			if err != nil || w.Key() != unfinished.Request {
				return time.Time{}, &UnfinishedError{Run: unfinished}
			}
		}
		r.run, r.sum.Resumed = unfinished, true
		return endOf(unfinished), nil
	}
	if ok {
		r.log.Warn("replay: --restart: abandoning the unfinished run", "run", unfinished.ID, "request", unfinished.Request,
			"position", unfinished.Position, "to_seq", unfinished.ToSeq)
		if !r.cfg.DryRun {
			if err := r.rec.abandon(ctx); err != nil {
				return time.Time{}, err
			}
		}
	}
	w, err := Plan(r.cfg.Request, history)
	if err != nil {
		return time.Time{}, err
	}
	from, to, err := resolve(ctx, stream, w)
	if err != nil {
		return time.Time{}, err
	}
	rec := Record{Stream: r.cfg.Stream, Exchange: r.cfg.Exchange, Request: w.Key(),
		WindowStart: timePtr(w.Start), WindowEnd: timePtr(w.End), FromSeq: from, ToSeq: to, Position: from - 1}
	if from <= to && !r.cfg.Restart {
		done, ok, err := r.rec.overlapping(ctx, r.cfg.Stream, from, to)
		switch {
		case err != nil:
			return time.Time{}, err
		case ok && done.Request == rec.Request:
			r.run, r.sum.AlreadyDone, r.sum.Finished = done, true, true
			return time.Time{}, nil
		case ok:
			return time.Time{}, &OverlapError{Run: done}
		}
	}
	if w.Ongoing {
		r.log.Warn("replay: the nats-only period has not ended: replaying up to the stream's last sequence now", "to_seq", to)
	}
	if r.cfg.DryRun {
		r.run = rec
		return w.End, nil
	}
	if r.run, err = r.rec.start(ctx, rec); err != nil {
		return time.Time{}, err
	}
	return w.End, nil
}

func endOf(r Record) time.Time {
	if r.WindowEnd == nil {
		return time.Time{}
	}
	return *r.WindowEnd
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
