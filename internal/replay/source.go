package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/internal/route"
)

// resolve turns w into the stream sequences from..to to read (from > to: an
// empty window). to is at most the stream's last sequence now: what is
// stored later is not the window's.
func resolve(ctx context.Context, stream jetstream.Stream, w Window) (from, to uint64, err error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("stream info: %w", err)
	}
	last := info.State.LastSeq
	to = last
	if w.ToSeq > 0 {
		to = min(w.ToSeq, last)
	}
	switch {
	case w.FromSeq > 0:
		from = w.FromSeq
	case info.State.Msgs == 0 || info.State.LastTime.Before(w.Start):
		from = last + 1
	default:
		if from, err = firstAfter(ctx, stream, w.Start); err != nil {
			return 0, 0, err
		}
	}
	return from, to, nil
}

// firstAfter is the sequence of the first message stored at or after t.
func firstAfter(ctx context.Context, stream jetstream.Stream, t time.Time) (uint64, error) {
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t, HeadersOnly: true,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return 0, fmt.Errorf("create ordered consumer: %w", err)
	}
	defer deleteConsumer(stream, cons)
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		return 0, fmt.Errorf("find the first message stored after %s: %w", t.Format(time.RFC3339), err)
	}
	meta, err := msg.Metadata()
	if err != nil {
		return 0, fmt.Errorf("message metadata: %w", err)
	}
	return meta.Sequence.Stream, nil
}

// source reads the window's messages in stream order through an ordered
// consumer, which recreates itself from the next sequence after a hiccup.
// It reads only the stream created at created: one deleted, or re-created
// under its name, stops the read (StreamGoneError, StreamReplacedError).
type source struct {
	stream  jetstream.Stream
	created time.Time
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	unhook  func() bool // stops it when the run's context ends
	reader  string      // the server-side consumer the last message came from
	batch   int
	to      uint64
	end     time.Time // zero: none
	routes  *route.Table
	done    bool
	expect  uint64                // the sequence that comes next unless it is gone
	gone    func(from, to uint64) // sequences of the window not in the stream
	errs    *errlog.Limiter       // JetStream not answering
}

func openSource(ctx context.Context, stream jetstream.Stream, created time.Time, from, to uint64, end time.Time, routes *route.Table, batch int, gone func(from, to uint64), log *slog.Logger) (*source, error) {
	s := &source{stream: stream, created: created, batch: batch, to: to, end: end, routes: routes,
		expect: from, gone: gone, errs: errlog.New(log, "replay: read the stream from JetStream")}
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// open reads on from the expected sequence. The ordered consumer tries once
// to recreate itself after a hiccup; next finds out why that failed.
func (s *source) open(ctx context.Context) error {
	cons, err := s.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: s.expect,
		// The server removes it soon if this process dies mid-run.
		InactiveThreshold: time.Minute,
		MaxResetAttempts:  1,
	})
	if err != nil {
		return fmt.Errorf("create ordered consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(min(2*s.batch, 2000)))
	if err != nil {
		deleteConsumer(s.stream, cons)
		return fmt.Errorf("consume: %w", err)
	}
	s.cons, s.it, s.unhook = cons, it, context.AfterFunc(ctx, it.Stop)
	return nil
}

func (s *source) close() {
	if s.it == nil {
		return
	}
	s.unhook()
	s.it.Stop()
	deleteConsumer(s.stream, s.cons)
	s.it = nil
}

// idleWait is how long next waits for a message before it asks whether any
// is left; infoWait bounds that question. One asked while NATS is
// unreachable is never answered, and the run's context has no deadline.
const (
	idleWait = 2 * time.Second
	infoWait = 5 * time.Second
)

// next returns the next message of the window, or ok false past its end.
func (s *source) next(ctx context.Context) (it item, ok bool, err error) {
	for !s.done {
		if s.it == nil {
			// The consumer could not recreate itself: read on once the
			// stream answers, and is still the run's.
			err := s.check(ctx)
			if err == nil {
				err = s.open(ctx)
			}
			if err != nil {
				if err := s.waitOut(ctx, err); err != nil {
					return item{}, false, err
				}
				continue
			}
		}
		msg, err := s.it.Next(jetstream.NextMaxWait(idleWait))
		if err != nil {
			if ctx.Err() != nil {
				return item{}, false, ctx.Err()
			}
			if !errors.Is(err, nats.ErrTimeout) {
				s.close()
				continue
			}
			// Nothing for a while: the messages up to `to` were deleted, the
			// stream was, or JetStream does not answer (the run waits for
			// it, saying so).
			ci, err := s.pending(ctx)
			if err != nil {
				if err := s.waitOut(ctx, err); err != nil {
					return item{}, false, err
				}
				continue
			}
			s.errs.OK()
			// Done only if nothing the server sent is still unseen: after a
			// lost connection it counts as delivered what never arrived,
			// and the ordered consumer asks for it again.
			if ci.NumPending == 0 && ci.Delivered.Stream < s.expect {
				s.done = true
				s.skipTo(s.to + 1)
			}
			continue
		}
		s.errs.OK()
		meta, err := msg.Metadata()
		if err != nil {
			return item{}, false, fmt.Errorf("message metadata: %w", err)
		}
		if meta.Consumer != s.reader {
			// The ordered consumer recreated itself: on this stream, or on
			// one re-created under its name?
			if err := s.check(ctx); err != nil {
				s.close()
				if err := s.waitOut(ctx, err); err != nil {
					return item{}, false, err
				}
				continue
			}
			s.reader = meta.Consumer
		}
		seq := meta.Sequence.Stream
		s.skipTo(min(seq, s.to+1))
		if seq > s.to || (!s.end.IsZero() && meta.Timestamp.After(s.end)) {
			s.done = true
			break
		}
		s.expect = seq + 1
		s.done = seq >= s.to || meta.NumPending == 0
		if s.done {
			s.skipTo(s.to + 1) // nothing after seq is left in the stream
		}
		m, why := toAMQP(msg.Subject(), msg.Headers(), msg.Data(), meta.Timestamp, s.routes)
		return item{seq: seq, msg: m, skip: why}, true, nil
	}
	return item{}, false, nil
}

// pending asks whether the stream is still the run's, then what its
// consumer has delivered and has left.
func (s *source) pending(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	ictx, cancel := context.WithTimeout(ctx, infoWait)
	defer cancel()
	ci, err := s.cons.Info(ictx)
	if err != nil {
		return nil, fmt.Errorf("consumer info: %w", err)
	}
	return ci, nil
}

// check asks JetStream whether the stream is still the one the run reads.
func (s *source) check(ctx context.Context) error {
	ictx, cancel := context.WithTimeout(ctx, infoWait)
	defer cancel()
	info, err := s.stream.Info(ictx)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return &StreamGoneError{Stream: s.stream.CachedInfo().Config.Name}
	case err != nil:
		return fmt.Errorf("stream info: %w", err)
	case !sameStream(info.Created, s.created):
		return &StreamReplacedError{Stream: info.Config.Name, Read: s.created, Now: info.Created}
	}
	return nil
}

// waitOut logs err, which JetStream may answer differently in a while, and
// waits a little. It returns what stops the run instead (nil: read on):
// ctx's end, or err when it is the stream's own end.
func (s *source) waitOut(ctx context.Context, err error) error {
	var gone *StreamGoneError
	var replaced *StreamReplacedError
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.As(err, &gone) || errors.As(err, &replaced):
		return err
	}
	s.errs.Error(err)
	if !backoff.Sleep(ctx, idleWait) {
		return ctx.Err()
	}
	return nil
}

// sameStream compares creation times as Postgres keeps them (microseconds).
func sameStream(a, b time.Time) bool {
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

// skipTo reports the sequences from the expected one up to seq (exclusive)
// as gone: the consumer passed over them, so the stream no longer has them.
func (s *source) skipTo(seq uint64) {
	if seq > s.expect {
		s.gone(s.expect, seq-1)
		s.expect = seq
	}
}

// deleteConsumer removes an ordered consumer at once rather than after its
// inactive threshold.
func deleteConsumer(stream jetstream.Stream, cons jetstream.Consumer) {
	if ci := cons.CachedInfo(); ci != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		stream.DeleteConsumer(ctx, ci.Name) //nolint:errcheck // it expires by itself
		cancel()
	}
}
