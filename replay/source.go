package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/errlog"
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
type source struct {
	stream jetstream.Stream
	cons   jetstream.Consumer
	it     jetstream.MessagesContext
	to     uint64
	end    time.Time // zero: none
	prefix string
	done   bool
	stop   func() bool
	expect uint64                // the sequence that comes next unless it is gone
	gone   func(from, to uint64) // sequences of the window not in the stream
	errs   *errlog.Limiter       // JetStream not answering
}

func openSource(ctx context.Context, stream jetstream.Stream, from, to uint64, end time.Time, prefix string, batch int, gone func(from, to uint64), log *slog.Logger) (*source, error) {
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
		// The server removes it soon if this process dies mid-run.
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("create ordered consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(min(2*batch, 2000)))
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	return &source{stream: stream, cons: cons, it: it, to: to, end: end, prefix: prefix, stop: context.AfterFunc(ctx, it.Stop),
		expect: from, gone: gone, errs: errlog.New(log, "replay: read the stream from JetStream")}, nil
}

func (s *source) close() {
	s.stop()
	s.it.Stop()
	deleteConsumer(s.stream, s.cons)
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
		msg, err := s.it.Next(jetstream.NextMaxWait(idleWait))
		if err != nil {
			if ctx.Err() != nil {
				return item{}, false, ctx.Err()
			}
			if !errors.Is(err, nats.ErrTimeout) {
				return item{}, false, fmt.Errorf("read the stream: %w", err)
			}
			// Nothing for a while: the messages up to `to` were deleted, or
			// JetStream does not answer (the run waits for it, saying so).
			ictx, cancel := context.WithTimeout(ctx, infoWait)
			ci, err := s.cons.Info(ictx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return item{}, false, ctx.Err()
				}
				s.errs.Error(fmt.Errorf("consumer info: %w", err))
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
		m, why := toAMQP(msg.Subject(), msg.Headers(), msg.Data(), meta.Timestamp, s.prefix)
		return item{seq: seq, msg: m, skip: why}, true, nil
	}
	return item{}, false, nil
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
