// Package replay exists for the rollback of the migration from RabbitMQ to
// JetStream (relayd replay): after the nats-only phase, it publishes to the
// legacy exchange the messages the stream got while RabbitMQ did not, so
// the legacy consumers can come back without a gap.
//
// It reads the stream in order from a window (by default the table's latest
// nats-only period, from its phase history), skips what RabbitMQ already has
// (the outbox's delivered record, the backfill's record), and publishes the
// rest through relayd's RabbitMQ sink: confirmed, persistent, mandatory, the
// same message id, headers and routing key the relay would have sent. The
// run's record in Postgres keeps the sequence up to which every message is
// confirmed or skipped, so a rerun after a crash resumes there.
package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/relay"
)

// Summary is what a run did.
type Summary struct {
	Record          Record        `json:"run"` // the run's record after it (zero in a dry run of a new window)
	Resumed         bool          `json:"resumed"`
	Read            int64         `json:"read"` // messages read this time
	Counts                        // this time's, recorded (dry run: counted)
	Failed          int64         `json:"failed"`  // refused by RabbitMQ (returned, nacked): the run stops; permanent ones are in Counts
	Missing         int64         `json:"missing"` // sequences of the window not in the stream (deleted, purged, removed by its limits): never sent
	Finished        bool          `json:"finished"`
	AlreadyDone     bool          `json:"already_done,omitempty"` // a finished run had this window: nothing sent
	DryRun          bool          `json:"dry_run"`
	Duration        time.Duration `json:"-"`
	DurationSeconds float64       `json:"duration_seconds"`
	Rate            float64       `json:"rate_per_second"` // messages read per second
}

// Progress is a snapshot of a run.
type Progress struct {
	FromSeq, ToSeq, Position uint64
	Summary
}

// ErrRunning: another replay of the table holds its lock.
var ErrRunning = errors.New("another relayd replay of this outbox is running")

// ErrPhaseNATS: the table is still in the nats-only phase; the relays would
// send nothing new to RabbitMQ and would finish the rows it owes without it.
var ErrPhaseNATS = errors.New("the outbox's phase is nats: set it to dual (or amqp) first, then replay")

// ErrRelayNATS: a running relay runs the nats phase (pinned with
// RELAY_TARGETS=nats, or not yet following the table's phase): it would
// keep finishing rows on JetStream only, after the window's end.
var ErrRelayNATS = errors.New("a running relay still runs the nats phase")

// ErrFailed: RabbitMQ refused a message (returned it unroutable, or nacked
// it). The run stops there. One it can never take (a *relay.PermanentError)
// is counted as failed_permanent and passed over instead.
var ErrFailed = errors.New("RabbitMQ refused a message")

// UnfinishedError: a run is unfinished and the request asks for another
// window.
type UnfinishedError struct{ Run Record }

func (e *UnfinishedError) Error() string {
	return fmt.Sprintf("replay run %d (%s, at sequence %d of %d..%d) is unfinished: rerun without window flags to resume it, or with --restart to abandon it",
		e.Run.ID, e.Run.Request, e.Run.Position, e.Run.FromSeq, e.Run.ToSeq)
}

// ElsewhereError: the unfinished run is of another stream or exchange than
// this one is configured with.
type ElsewhereError struct {
	Run              Record
	Stream, Exchange string // as configured now
}

func (e *ElsewhereError) Error() string {
	return fmt.Sprintf("replay run %d is unfinished, from stream %q to exchange %q, not stream %q to exchange %q: resume it with RELAY_NATS_STREAM and RELAY_AMQP_EXCHANGE as they were, or --restart to abandon it",
		e.Run.ID, e.Run.Stream, e.Run.Exchange, e.Stream, e.Exchange)
}

// OverlapError: a finished run already replayed some of the window's
// sequences; replaying them again would duplicate them on RabbitMQ.
type OverlapError struct{ Run Record }

func (e *OverlapError) Error() string {
	return fmt.Sprintf("replay run %d already replayed sequences %d..%d of stream %s: give a window after them, or --restart to replay them again",
		e.Run.ID, e.Run.FromSeq, e.Run.ToSeq, e.Run.Stream)
}

// StreamGoneError: the stream the run reads does not exist. The messages of
// its window not yet replayed are in no stream; a restore from a backup keeps
// the stream's sequences and creation time, and a rerun resumes on it.
type StreamGoneError struct{ Stream string }

func (e *StreamGoneError) Error() string {
	return fmt.Sprintf("stream %s does not exist: the messages of the window not yet replayed are in no stream; restore it from a backup (which keeps its sequences) and rerun to resume", e.Stream)
}

// StreamReplacedError: a stream of the run's name exists, but not the one the
// run read: it was re-created, and its sequences are other messages.
type StreamReplacedError struct {
	Stream    string
	Read, Now time.Time // the creation times of the stream the run read and of the one there now
}

func (e *StreamReplacedError) Error() string {
	return fmt.Sprintf("stream %s was re-created at %s, after the one the run read (created at %s): its sequences are other messages and are not read; restore the stream the run read and rerun to resume, or rerun with --restart to replay a window of this one",
		e.Stream, e.Now.UTC().Format(time.RFC3339Nano), e.Read.UTC().Format(time.RFC3339Nano))
}

// item is one message of the window.
type item struct {
	seq  uint64
	msg  *relay.Message // nil when skipped before the lookup
	skip skip
	err  error // publish writes the verdict; settle reads it once done is closed
}

// batch is consecutive items, published together.
type batch struct {
	items []item
	done  chan struct{} // closed once the batch's publish has written every verdict
}

// runner is one run. dispatch reads and publishes from the calling
// goroutine, each batch's publish runs in its own, and settle records
// positions in another; mu guards the fields after it.
type runner struct {
	cfg     Config
	log     *slog.Logger
	rec     records
	limiter *rate.Limiter
	pause   pause // every batch's publish waits on it while RabbitMQ refuses
	start   time.Time

	mu       sync.Mutex
	sum      Summary   // dispatch, gone and settle add to it; finish copies it
	run      Record    // settle moves its position past each recorded batch
	warnNext time.Time // warn logs again only after it
}

// Run replays the window and returns what it did. Cancelling ctx stops
// reading; the batches sent wait for their confirms (PublishTimeout), the
// position is recorded, and the summary comes with ctx's error.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if err := cfg.applyDefaults(); err != nil {
		return Summary{}, err
	}
	r := &runner{cfg: cfg, log: cfg.Logger, start: time.Now(),
		rec:     newRecords(cfg.DB, cfg.Table),
		limiter: rate.NewLimiter(rate.Limit(cfg.Rate), cfg.BatchSize)}
	r.sum.DryRun = cfg.DryRun
	ok, err := r.rec.lock.take(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("take the replay lock: %w", err)
	}
	if !ok {
		return Summary{}, ErrRunning
	}
	defer r.rec.lock.release()
	if err := r.checkPhase(ctx); err != nil {
		return Summary{}, err
	}
	if !cfg.DryRun {
		if err := r.awaitClaims(ctx); err != nil {
			return Summary{}, err
		}
	}
	stream, err := r.stream(ctx)
	if err != nil {
		return Summary{}, err
	}
	window, err := r.choose(ctx, stream)
	if err != nil || r.sum.AlreadyDone {
		return r.finish(), err
	}
	if err := r.checkRecordReach(ctx); err != nil {
		return r.finish(), err
	}
	r.log.Info("replay: window", "run", r.run.ID, "request", r.run.Request, "from_seq", r.run.FromSeq,
		"to_seq", r.run.ToSeq, "position", r.run.Position, "resumed", r.sum.Resumed, "dry_run", cfg.DryRun)
	err = r.replay(ctx, stream, window)
	return r.finish(), err
}

// stream looks the configured stream up. When it does not exist, an
// unfinished run of it cannot go on: the error says so.
func (r *runner) stream(ctx context.Context) (jetstream.Stream, error) {
	stream, err := r.cfg.JS.Stream(ctx, r.cfg.Stream)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", r.cfg.Stream, err)
		}
		return stream, nil
	}
	run, ok, rerr := r.rec.unfinished(ctx)
	if rerr != nil || !ok || run.Stream != r.cfg.Stream || r.cfg.Restart {
		return nil, fmt.Errorf("stream %s does not exist in JetStream: nothing to replay from (RELAY_NATS_STREAM)", r.cfg.Stream)
	}
	return nil, fmt.Errorf("%s: %w", run.where(), &StreamGoneError{Stream: r.cfg.Stream})
}

// checkPhase refuses a run while the table is in the nats-only phase, or a
// running relay runs it (a dry run only warns).
func (r *runner) checkPhase(ctx context.Context) error {
	var errs []error
	c, ok, err := phase.Read(ctx, r.cfg.DB, r.cfg.Table)
	if err != nil {
		return err
	}
	if ok && c.Phase == phase.NATS {
		errs = append(errs, ErrPhaseNATS)
	}
	running, err := phase.Running(ctx, r.cfg.DB, r.cfg.Table)
	if err != nil {
		return err
	}
	var names []string
	for _, in := range running {
		if in.Phase == phase.NATS {
			names = append(names, in.Instance+pinnedNote(in))
		}
	}
	if len(names) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s: stop them, or let them follow the table's phase, then replay",
			ErrRelayNATS, strings.Join(names, ", ")))
	}
	if len(errs) == 0 {
		return nil
	}
	if r.cfg.DryRun {
		for _, err := range errs {
			r.log.Warn("replay: " + err.Error())
		}
		return nil
	}
	return errors.Join(errs...)
}

func pinnedNote(in phase.Instance) string {
	if in.Pinned {
		return " (pinned by RELAY_TARGETS)"
	}
	return ""
}

func (r *runner) finish() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sum
	s.Record = r.run
	s.Duration = time.Since(r.start)
	s.DurationSeconds = s.Duration.Seconds()
	if sec := s.Duration.Seconds(); sec > 0 {
		s.Rate = float64(s.Read) / sec
	}
	return s
}

// progress reports a snapshot to OnProgress.
func (r *runner) progress() {
	if r.cfg.OnProgress == nil {
		return
	}
	s := r.finish()
	r.cfg.OnProgress(Progress{FromSeq: s.Record.FromSeq, ToSeq: s.Record.ToSeq, Position: s.Record.Position, Summary: s})
}

// warn logs at most every 30 s.
func (r *runner) warn(msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	ok := now.After(r.warnNext)
	if ok {
		r.warnNext = now.Add(30 * time.Second)
	}
	r.mu.Unlock()
	if ok {
		r.log.Warn(msg, args...)
	}
}
