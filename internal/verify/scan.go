package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/outboxsql"
)

// scan reads stream name from Since-Slack-Duplicates until a message stored
// after Until+Slack, the last sequence at the start of the scan, or the end
// of the stream, copies every (Nats-Msg-Id, sequence) pair to Postgres, and
// says what it read in sc.
func (r *run) scan(ctx context.Context, name string, sc *Scan) error {
	stream, err := r.cfg.JS.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("stream %s not found: %w", name, jetstream.ErrStreamNotFound)
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := stream.Info(ctx) // fresh: CachedInfo is as old as the handle
	if err != nil {
		return fmt.Errorf("stream %s info: %w", name, err)
	}
	sc.LastSeqAtStart = info.State.LastSeq
	sc.From = r.cfg.Since.Add(-r.cfg.Slack - info.Config.Duplicates)
	log := r.cfg.Logger.With("stream", name)
	if info.State.Msgs == 0 || info.State.LastTime.Before(sc.From) {
		log.Info("verify: nothing to scan", "stream_messages", info.State.Msgs, "last_time", info.State.LastTime)
		return nil
	}
	s, err := r.openScanner(ctx, stream, name, sc, log)
	if err != nil {
		return err
	}
	defer s.close()
	log.Info("verify: scanning stream", "from", sc.From, "to", sc.To, "last_seq", sc.LastSeqAtStart)
	return s.read(ctx)
}

// scanner reads the stream through one ordered consumer and copies what it
// reads to Postgres a batch at a time.
type scanner struct {
	r            *run
	name         string // the stream's
	sc           *Scan
	log          *slog.Logger
	cons         jetstream.Consumer
	it           jetstream.MessagesContext
	stopOnCancel func() bool
	batch        *pairs
}

// openScanner creates an ordered, headers-only consumer from Scan.From.
func (r *run) openScanner(ctx context.Context, stream jetstream.Stream, name string, sc *Scan, log *slog.Logger) (*scanner, error) {
	from := sc.From
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &from,
		HeadersOnly:   true,
		// The server removes it soon if this process dies mid-scan.
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: create ordered consumer: %w", name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(min(r.cfg.BatchSize, 2000)))
	if err != nil {
		return nil, fmt.Errorf("stream %s: consume: %w", name, err)
	}
	return &scanner{
		r: r, name: name, sc: sc, log: log, cons: cons, it: it,
		stopOnCancel: context.AfterFunc(ctx, it.Stop),
		batch:        newPairs(r.cfg.BatchSize),
	}, nil
}

// close stops reading and deletes the consumer.
func (s *scanner) close() {
	s.stopOnCancel()
	s.it.Stop()
	if ci := s.cons.CachedInfo(); ci != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.r.cfg.JS.DeleteConsumer(dctx, s.name, ci.Name) //nolint:errcheck // it expires by itself
		cancel()
	}
}

// read takes messages until one past the scan's end, or none is left, and
// flushes the last batch.
func (s *scanner) read(ctx context.Context) error {
	sc := s.sc
	nextLog := time.Now().Add(5 * time.Second)
	for {
		msg, err := s.next(ctx)
		if err != nil {
			return err
		}
		if msg == nil {
			break
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("stream %s: message metadata: %w", s.name, err)
		}
		seq := meta.Sequence.Stream
		if meta.Timestamp.After(sc.To) || seq > sc.LastSeqAtStart {
			break
		}
		if err := s.take(ctx, seq, msg.Headers().Get(jetstream.MsgIDHeader)); err != nil {
			return err
		}
		if now := time.Now(); now.After(nextLog) {
			nextLog = now.Add(5 * time.Second)
			s.log.Info("verify: scanning", "seq", seq, "last_seq", sc.LastSeqAtStart, "messages", sc.Messages)
		}
		if seq >= sc.LastSeqAtStart || meta.NumPending == 0 {
			break
		}
	}
	return s.flush(ctx)
}

// next returns the next message, or nil when the consumer has nothing
// left to deliver.
func (s *scanner) next(ctx context.Context) (jetstream.Msg, error) {
	for {
		msg, err := s.it.Next(jetstream.NextMaxWait(s.r.cfg.IdleTimeout))
		if err == nil {
			return msg, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("stream %s: read: %w", s.name, err)
		}
		// Nothing for a while: done if the consumer has nothing left (the
		// messages up to the last sequence were deleted meanwhile), else
		// keep waiting.
		ci, err := s.cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("stream %s: consumer info: %w", s.name, err)
		}
		if ci.NumPending == 0 {
			return nil, nil
		}
	}
}

// take counts the message at seq and adds its id to the batch, flushing a
// full one.
func (s *scanner) take(ctx context.Context, seq uint64, id string) error {
	sc := s.sc
	if sc.FirstSeq == 0 {
		sc.FirstSeq = seq
	}
	sc.LastSeq = seq
	sc.Messages++
	if id != "" {
		s.batch.add(id, int64(seq))
	} else {
		sc.WithoutMsgID++
	}
	if s.batch.len() >= s.r.cfg.BatchSize {
		return s.flush(ctx)
	}
	return nil
}

// flush copies the batch to the stream's temporary table.
func (s *scanner) flush(ctx context.Context) error {
	if s.batch.len() == 0 {
		return nil
	}
	if _, err := s.r.conn.CopyFrom(ctx, pgx.Identifier{"pg_temp", outboxsql.VerifyStream}, []string{"msg_id", "seq"}, s.batch.source()); err != nil {
		return fmt.Errorf("copy stream ids to postgres: %w", err)
	}
	s.batch.reset()
	return nil
}

// pairs is one batch of (id, sequence) pairs, reused from batch to batch.
type pairs struct {
	ids  []string
	seqs []int64
	i    int
	row  [2]any
}

func newPairs(n int) *pairs {
	return &pairs{ids: make([]string, 0, n), seqs: make([]int64, 0, n)}
}

func (p *pairs) add(id string, seq int64) {
	p.ids = append(p.ids, id)
	p.seqs = append(p.seqs, seq)
}

func (p *pairs) len() int { return len(p.ids) }

func (p *pairs) reset() {
	clear(p.ids) // let the strings go
	p.ids, p.seqs = p.ids[:0], p.seqs[:0]
}

// source returns the batch as a pgx.CopyFromSource.
func (p *pairs) source() pgx.CopyFromSource {
	p.i = -1
	return p
}

func (p *pairs) Next() bool { p.i++; return p.i < len(p.ids) }

// Values reuses one slice: pgx encodes a row before asking for the next.
func (p *pairs) Values() ([]any, error) {
	p.row[0], p.row[1] = p.ids[p.i], p.seqs[p.i]
	return p.row[:], nil
}

func (p *pairs) Err() error { return nil }
