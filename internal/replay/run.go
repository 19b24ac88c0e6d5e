package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/relay"
)

// replay reads the run's window from its position and publishes it,
// InFlight batches at once; settle records them in stream order.
func (r *runner) replay(ctx context.Context, stream jetstream.Stream, end time.Time) error {
	from, to := r.run.Position+1, r.run.ToSeq
	if from > to {
		return r.complete()
	}
	src, err := openSource(ctx, stream, stream.CachedInfo().Created, from, to, end, r.cfg.routes(), r.cfg.BatchSize, r.gone, r.log)
	if err != nil {
		return fmt.Errorf("stream %s: %w", r.cfg.Stream, err)
	}
	defer src.close()
	// A refused message stops the reading, not the settling of what was sent.
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	sem := make(chan struct{}, r.cfg.InFlight)
	sent := make(chan *batch, r.cfg.InFlight)
	settled := make(chan settleResult, 1)
	go func() { settled <- r.settle(ctx, sent, sem, stopReading) }()
	readErr := r.dispatch(readCtx, src, sent, sem)
	close(sent)
	res := <-settled
	if n := r.finish().Missing; n > 0 {
		r.log.Warn(fmt.Sprintf("replay: %d sequences of the window were not in the stream (deleted, purged, or removed by its limits): RabbitMQ never gets them", n),
			"missing", n)
	}
	switch {
	case res.err != nil:
		return res.err
	case ctx.Err() != nil:
		return ctx.Err()
	case readErr != nil:
		return fmt.Errorf("%s: %w", r.run.where(), readErr)
	case res.stopped:
		return fmt.Errorf("replay stopped at sequence %d", r.run.Position)
	}
	return r.complete()
}

// dispatch reads batches, looks their ids up, and sends each at the rate.
func (r *runner) dispatch(ctx context.Context, src *source, sent chan<- *batch, sem chan struct{}) error {
	for {
		b := &batch{done: make(chan struct{})}
		for len(b.items) < r.cfg.BatchSize {
			it, ok, err := src.next(ctx)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			b.items = append(b.items, it)
		}
		if len(b.items) == 0 {
			return nil
		}
		r.mu.Lock()
		r.sum.Read += int64(len(b.items))
		r.mu.Unlock()
		if err := r.lookup(ctx, b.items); err != nil {
			return fmt.Errorf("look up what RabbitMQ has: %w", err)
		}
		n := 0
		for _, it := range b.items {
			if it.skip == send {
				n++
			}
		}
		if n > 0 && !r.cfg.DryRun {
			if err := r.limiter.WaitN(ctx, n); err != nil {
				return ctx.Err()
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		if n == 0 || r.cfg.DryRun {
			close(b.done)
		} else {
			go func() { r.publish(ctx, b); close(b.done) }()
		}
		sent <- b
		if src.done {
			return nil
		}
	}
}

// gone counts sequences from..to of the window that the stream no longer
// has: the position passes over them, and nothing can send them.
func (r *runner) gone(from, to uint64) {
	r.mu.Lock()
	r.sum.Missing += int64(to - from + 1)
	r.mu.Unlock()
	r.warn("replay: sequences of the window are not in the stream (deleted, purged, or removed by its limits)",
		"from_seq", from, "to_seq", to)
}

type settleResult struct {
	err     error
	stopped bool // a batch was not wholly confirmed: nothing after it is recorded
}

// settle takes the batches in stream order as their confirms come, and
// records the position past each: past a batch not wholly confirmed, only up
// to the message before the first unconfirmed one, and nothing after it.
func (r *runner) settle(ctx context.Context, sent <-chan *batch, sem <-chan struct{}, stopReading func()) settleResult {
	var res settleResult
	for b := range sent {
		<-b.done
		<-sem
		if res.stopped {
			continue
		}
		var c Counts
		pos := uint64(0)
		for _, it := range b.items {
			if it.skip == send && relay.IsPermanent(it.err) {
				// The relay would park such a row: pass it over, settled.
				r.log.Error("replay: RabbitMQ can never take this message: passed over", "seq", it.seq,
					"message_id", it.msg.MessageID, "reason", it.err.Error())
				c.FailedPermanent++
				pos = it.seq
				continue
			}
			if it.skip == send && it.err != nil {
				res.stopped = true
				if !transient(it.err) {
					res.err = fmt.Errorf("%w: message %s (stream sequence %d): %w", ErrFailed, it.msg.MessageID, it.seq, it.err)
				}
				break
			}
			c.add(it.skip)
			pos = it.seq
		}
		if res.stopped {
			r.countFailed(b)
			stopReading()
		}
		if pos == 0 {
			continue
		}
		if !r.cfg.DryRun {
			if err := r.record(r.run.Position, pos, c, false); err != nil {
				res.err, res.stopped = err, true
				stopReading()
				continue
			}
		}
		r.mu.Lock()
		r.run.Position = pos
		r.run.Counts.plus(c)
		r.sum.Counts.plus(c)
		r.mu.Unlock()
		r.progress()
	}
	return res
}

func (r *runner) countFailed(b *batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range b.items {
		if it.skip == send && it.err != nil && !transient(it.err) && !relay.IsPermanent(it.err) {
			r.sum.Failed++
		}
	}
}

// complete closes the run: its whole window is confirmed or skipped.
func (r *runner) complete() error {
	if !r.cfg.DryRun {
		if err := r.record(r.run.Position, r.run.Position, Counts{}, true); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.sum.Finished = true
	if !r.cfg.DryRun {
		now := time.Now()
		r.run.FinishedAt = &now
	}
	r.mu.Unlock()
	r.progress()
	return nil
}

// record moves the position from expected (the one last recorded) to pos,
// trying again while Postgres fails, past the run's context: what is
// confirmed and not recorded is sent again by a rerun.
func (r *runner) record(expected, pos uint64, c Counts, finish bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wait := retryBackoff.Next(0)
	for again := false; ; again = true {
		err := r.rec.advance(ctx, r.run.ID, expected, pos, c, finish, again)
		if err == nil || errors.Is(err, ErrAdvanced) || errors.Is(err, ErrLockLost) {
			return err
		}
		r.warn("replay: recording the position failed; trying again", "error", err.Error())
		if !backoff.Sleep(ctx, wait) {
			return err
		}
		wait = retryBackoff.Next(wait)
	}
}
