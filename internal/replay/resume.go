package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/phase"
)

// choose sets the run to do: the unfinished one (resumed: its window, from
// its position) when the request is empty or the same, else a new run of the
// requested window, recorded before anything is sent. It returns the time
// past which the read stops (zero: none).
func (r *runner) choose(ctx context.Context, stream jetstream.Stream) (end time.Time, err error) {
	created := stream.CachedInfo().Created
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
			w, err := r.plan(ctx, history)
			if err != nil || w.Key() != unfinished.Request {
				return time.Time{}, &UnfinishedError{Run: unfinished}
			}
		}
		if unfinished.Stream != r.cfg.Stream || unfinished.Exchange != r.cfg.Exchange {
			// Its position counts that stream's sequences, and the rest of
			// its messages are owed to that exchange.
			return time.Time{}, &ElsewhereError{Run: unfinished, Stream: r.cfg.Stream, Exchange: r.cfg.Exchange}
		}
		if c := unfinished.StreamCreated; c != nil && !sameStream(*c, created) {
			return time.Time{}, fmt.Errorf("%s: %w", unfinished.where(), &StreamReplacedError{Stream: r.cfg.Stream, Read: *c, Now: created})
		}
		r.run, r.sum.Resumed = unfinished, true
		return endOf(unfinished), nil
	}
	if ok {
		if err := r.abandon(ctx, unfinished); err != nil {
			return time.Time{}, err
		}
	}
	w, err := r.plan(ctx, history)
	if err != nil {
		return time.Time{}, err
	}
	from, to, err := resolve(ctx, stream, w)
	if err != nil {
		return time.Time{}, err
	}
	rec := Record{Stream: r.cfg.Stream, Exchange: r.cfg.Exchange, Request: w.Key(),
		WindowStart: timePtr(w.Start), WindowEnd: timePtr(w.End), FromSeq: from, ToSeq: to, Position: from - 1,
		StreamCreated: &created}
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

// plan is Plan with the rows finished without RabbitMQ since the latest
// nats-only period began, read unless the request names a sequence: they
// move a default window's edges, and a --since after them is warned of.
func (r *runner) plan(ctx context.Context, history []phase.Change) (Window, error) {
	var stranded Stranded
	req := r.cfg.Request
	if p, ok := phase.LastPeriod(history, phase.NATS); ok && req.FromSeq == 0 {
		s, afterEnd, err := r.rec.stranded(ctx, p)
		if err != nil {
			return Window{}, err
		}
		switch {
		case !req.Since.IsZero():
			if !s.Earliest.IsZero() && s.Earliest.Before(req.Since) {
				r.log.Warn("replay: rows finished without RabbitMQ since the nats-only period began reached JetStream before --since, and are not replayed: run without --since to include them",
					"since", req.Since, "earliest_nats_delivered_at", s.Earliest)
			}
		default:
			stranded = s
			if !s.Earliest.IsZero() && s.Earliest.Before(p.Start) {
				r.log.Info("replay: rows RabbitMQ was owed at the move to nats reached JetStream before the period: the window starts earlier",
					"period_start", p.Start, "earliest_nats_delivered_at", s.Earliest)
			}
			if afterEnd > 0 {
				r.log.Info("replay: rows finished without RabbitMQ after the nats-only period ended (batches claimed in it, or a relay pinned to nats): the window reaches them",
					"period_end", p.End, "rows", afterEnd, "latest_nats_delivered_at", s.Latest)
			}
		}
	}
	return Plan(req, history, stranded)
}

// abandon gives up the unfinished run for --restart. The sequences it
// settled are not remembered: a window over them sends them again.
func (r *runner) abandon(ctx context.Context, run Record) error {
	args := []any{"run", run.ID, "request", run.Request, "position", run.Position, "to_seq", run.ToSeq}
	if run.Position >= run.FromSeq {
		settled := run.Position - run.FromSeq + 1
		r.log.Warn(fmt.Sprintf("replay: --restart abandons run %d, which had settled %d sequences (%d..%d): a window over them sends what it sent of them again",
			run.ID, settled, run.FromSeq, run.Position), append(args, "settled", settled)...)
	} else {
		r.log.Warn("replay: --restart: abandoning the unfinished run", args...)
	}
	if r.cfg.DryRun {
		return nil
	}
	return r.rec.abandon(ctx)
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

// checkRecordReach warns when the delivered record begins after the run's
// window starts: the older rows are past RELAY_RETENTION, so the lookups do
// not skip what RabbitMQ got before, and rows stranded at the move to nats
// before it never moved the window's start.
func (r *runner) checkRecordReach(ctx context.Context) error {
	if r.run.WindowStart == nil || r.run.WindowStart.After(time.Now().Add(-r.cfg.Retention)) {
		return nil // the record of the whole window is kept
	}
	var first *time.Time
	if err := r.cfg.DB.QueryRow(ctx, r.rec.q.ReplayRecordStart).Scan(&first); err != nil {
		return fmt.Errorf("read the delivered record's start: %w", err)
	}
	if first != nil && !first.After(*r.run.WindowStart) {
		return nil
	}
	begins := "is empty"
	if first != nil {
		begins = "begins at " + first.UTC().Format(time.RFC3339)
	}
	r.log.Warn(fmt.Sprintf("replay: the delivered record %s, after the window's start %s (RELAY_RETENTION removed older rows): messages RabbitMQ got before it are sent again, and rows stranded at the move to nats before it are not replayed",
		begins, r.run.WindowStart.UTC().Format(time.RFC3339)), "window_start", *r.run.WindowStart, "record_start", first)
	return nil
}
