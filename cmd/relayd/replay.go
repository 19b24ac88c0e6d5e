package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/relayd/relayd/internal/replay"
)

const replayHelp = `Usage: relayd replay [--since T | --from-seq N] [--to-seq N] [--rate R] [--restart] [--dry-run] [--json]

Rolls the migration back: publishes to the legacy exchange (RELAY_AMQP_EXCHANGE)
the messages the stream (RELAY_NATS_STREAM, or --stream) got while RabbitMQ
did not, with the relay's message-id, headers and properties, to the exchange
and routing key of the message's route (RELAY_ROUTES: the route that gives its
subject; by default RELAY_AMQP_EXCHANGE and the subject less
RELAY_NATS_SUBJECT_PREFIX), confirmed, persistent and mandatory: a message
RabbitMQ returns unroutable or nacks stops the run (exit 1); one it can never
take (a routing key over 255 bytes, headers it refuses) is logged, counted as
failed_permanent and passed over.

The window is by default the outbox's latest nats-only period, from its phase
history, widened by 1m each side (to the stream's last sequence if the
period goes on), and started earlier when rows RabbitMQ was owed at the move
to nats reached JetStream before it. Messages RabbitMQ has are skipped: in <table>_delivered with
amqp_delivered_at, in the outbox (owed to every target), in <table>_owed
delivered to it or owed to it, or moved by the backfill
(<table>_backfilled). Messages without a Nats-Msg-Id are counted and skipped.

Progress is recorded in <table>_replay: a rerun after a crash or SIGINT
resumes the unfinished run from the sequence up to which everything was
confirmed or skipped. While a run is unfinished, other window flags are
refused unless --restart. Set the phase to dual (or amqp) first: replay
refuses to run while it is nats, or while a running relay still runs nats
(pinned with RELAY_TARGETS=nats).

Uses RELAY_DATABASE_URL, RELAY_OUTBOX_TABLE, RELAY_AMQP_URL,
RELAY_AMQP_EXCHANGE, RELAY_NATS_URL, RELAY_NATS_STREAM,
RELAY_NATS_SUBJECT_PREFIX and RELAY_ROUTES.

Exit status: 0 done (or interrupted: rerun to continue), 1 failed, 2 bad usage.

Flags:
`

type replayFlags struct {
	req                     replay.Request
	rate                    float64
	restart, dryRun, asJSON bool
	connectTimeout          time.Duration
	stream                  string // "": RELAY_NATS_STREAM
}

// replayCommand is relayd replay: the rollback.
type replayCommand struct {
	*cli
	replayFlags
	since string
}

func (c *replayCommand) flags() *flag.FlagSet {
	f := &c.replayFlags
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.StringVar(&c.since, "since", "", "replay from this time: RFC 3339, or a duration meaning that long ago (default: the latest nats-only period)")
	fs.Uint64Var(&f.req.FromSeq, "from-seq", 0, "replay from this stream sequence")
	fs.Uint64Var(&f.req.ToSeq, "to-seq", 0, "replay up to this stream sequence (default: the period's end, or the stream's last)")
	fs.Float64Var(&f.rate, "rate", replay.DefaultRate, "at most R messages per second")
	fs.BoolVar(&f.restart, "restart", false, "abandon an unfinished run, or replay sequences a finished run did")
	fs.BoolVar(&f.dryRun, "dry-run", false, "count what would be sent and skipped; publish and record nothing")
	fs.BoolVar(&f.asJSON, "json", false, "print the summary as JSON")
	fs.StringVar(&f.stream, "stream", "", "replay this stream, one a route names (default RELAY_NATS_STREAM)")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *replayCommand) Usage() string { return withFlagDefaults(c.flags(), replayHelp) }

func (c *replayCommand) Run(ctx context.Context, args []string) error {
	if err := c.parse(args); err != nil {
		return err
	}
	if err := amqpURLVar(c.env); err != nil {
		return err
	}
	ss, err := openSession(ctx, c.cli, sessionOptions{Conns: workerConns, NATS: true, Migrates: true, ConnectTimeout: c.connectTimeout})
	if err != nil {
		return err
	}
	defer ss.close()
	return runReplay(ss, c.replayFlags, c.stdout, c.stderr)
}

// parse reads and checks the flags.
func (c *replayCommand) parse(args []string) error {
	if err := parseFlags(c.flags(), args); err != nil {
		return err
	}
	f := &c.replayFlags
	if c.since != "" {
		t, err := parseWhen(c.since, time.Now())
		if err != nil {
			return usagef("--since: %v", err)
		}
		f.req.Since = t
	}
	switch {
	case !f.req.Since.IsZero() && f.req.FromSeq > 0:
		return usagef("--since and --from-seq exclude each other: give one")
	case f.req.ToSeq > 0 && f.req.FromSeq > f.req.ToSeq:
		return usagef("--from-seq %d is past --to-seq %d", f.req.FromSeq, f.req.ToSeq)
	case strings.ContainsAny(f.stream, " \t.*>"):
		return usagef("--stream %q is not a valid stream name", f.stream)
	case !(f.rate > 0):
		return usagef("--rate %v is out of range: want more than 0", f.rate)
	}
	return checkConnectTimeout(f.connectTimeout)
}

func runReplay(ss *session, f replayFlags, stdout, stderr io.Writer) error {
	cfg, log, ctx := ss.cfg, ss.log, ss.ctx
	if err := checkSchema(ctx, cfg, ss.pool, log); err != nil {
		return logged("replay", err)
	}
	rc := replay.Config{
		DB: ss.pool, Table: cfg.table, JS: ss.js, Stream: cmp.Or(f.stream, cfg.NATSStream), SubjectPrefix: cfg.NATSSubjectPrefix, Routes: cfg.routes,
		Exchange: cfg.AMQPExchange, Request: f.req, Restart: f.restart, DryRun: f.dryRun, Rate: f.rate,
		PublishTimeout: cfg.PublishTimeout, Retention: cfg.Retention, Logger: log,
	}
	if !f.dryRun {
		sink, closeSink, err := openAMQPSink(ctx, cfg, log)
		if err != nil {
			if unreachableErr(err) {
				return errors.New(amqpFailure(cfg, cfg.StartupTimeout, err))
			}
			return logged("replay: connect to rabbitmq", err)
		}
		defer closeSink()
		rc.Sink = sink
	}
	rep := newReplayReporter(stderr, log)
	rc.OnProgress = rep.update
	sum, err := replay.Run(ctx, rc)
	rep.finish()
	interrupted := errors.Is(err, ctx.Err()) && ctx.Err() != nil
	if err != nil && !interrupted {
		if sum.Record.ID != 0 || sum.Read > 0 {
			printReplay(stdout, sum, f.asJSON)
		}
		return logged("replay failed", err)
	}
	if interrupted {
		log.Info("replay interrupted: rerun to continue where it stopped")
	}
	printReplay(stdout, sum, f.asJSON)
	return nil
}

func printReplay(w io.Writer, s replay.Summary, asJSON bool) {
	if asJSON {
		printJSON(w, s)
		return
	}
	r := s.Record
	title := fmt.Sprintf("replay run %d: stream %s to exchange %s", r.ID, r.Stream, r.Exchange)
	if s.DryRun {
		title = fmt.Sprintf("replay (dry run: nothing was published or recorded; figures are what a run would do): stream %s to exchange %s", r.Stream, r.Exchange)
	}
	fmt.Fprintln(w, title)
	fmt.Fprintf(w, "  window:         %s, sequences %d..%d\n", r.Request, r.FromSeq, r.ToSeq)
	state := "unfinished: rerun to continue"
	switch {
	case s.AlreadyDone:
		state = "already replayed by this run: nothing to do"
	case s.Finished:
		state = "finished"
	}
	if s.Resumed {
		state += " (resumed)"
	}
	fmt.Fprintf(w, "  position:       %d (%s)\n", r.Position, state)
	fmt.Fprintf(w, "  read:           %d\n  sent:           %d\n", s.Read, s.Sent)
	fmt.Fprintf(w, "  skipped:        %d delivered, %d backfilled, %d owed by the relays\n", s.SkippedDelivered, s.SkippedBackfilled, s.SkippedOwed)
	fmt.Fprintf(w, "  without id:     %d\n  other subjects: %d\n", s.WithoutID, s.OtherSubject)
	fmt.Fprintf(w, "  failed:         %d (the run stops), %d permanent (RabbitMQ can never take them: logged, passed over)\n", s.Failed, s.FailedPermanent)
	if s.Missing > 0 {
		fmt.Fprintf(w, "  not in stream:  %d (deleted, purged or removed by its limits: never sent)\n", s.Missing)
	}
	fmt.Fprintf(w, "  rate:           %.0f msg/s\n  duration:       %s\n", s.Rate, s.Duration.Round(time.Millisecond))
}

// replayReporter shows progress: a bar over the window's sequences on a
// terminal, a log line every 5 s otherwise.
type replayReporter struct {
	mu   sync.Mutex
	line progressLine
}

func newReplayReporter(w io.Writer, log *slog.Logger) *replayReporter {
	return &replayReporter{line: newProgressLine(w, log, "replay")}
}

func (r *replayReporter) update(p replay.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	done := int64(0)
	if p.Position >= p.FromSeq {
		done = int64(p.Position - p.FromSeq + 1)
	}
	r.line.show(done, int64(p.ToSeq)-int64(p.FromSeq)+1, "position", p.Position, "to_seq", p.ToSeq, "sent", p.Sent,
		"skipped", p.Skipped(), "rate", fmt.Sprintf("%.0f/s", p.Rate))
}

func (r *replayReporter) finish() { r.line.finish() }
