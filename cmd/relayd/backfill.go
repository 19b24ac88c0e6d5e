package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sethvargo/go-envconfig"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayd/relayd/backfill"
)

const backfillHelp = `Usage: relayd backfill --queue NAME [flags]

Moves every message of a legacy RabbitMQ queue into the JetStream stream,
exactly once: each delivery is acked on RabbitMQ only after JetStream acked
it. Messages the relay already delivered to JetStream (by message-id, within
RELAY_RETENTION) are acked without being re-sent. Messages without a message-id get
an id derived from their content (see docs/message-ids.md) and the Relay-Derived-Id header.
Stops by itself once the queue is drained and prints a summary. SIGINT stops
cleanly; a rerun continues where it stopped.

Uses RELAY_DATABASE_URL, RELAY_OUTBOX_TABLE, RELAY_AMQP_URL, RELAY_NATS_URL,
RELAY_NATS_STREAM and RELAY_NATS_SUBJECT_PREFIX, and waits up to
RELAY_STARTUP_TIMEOUT for Postgres and NATS. Its relayd_backfill_* metrics
are served only on --metrics-addr, not on RELAY_METRICS_ADDR, where a relayd
on the same host listens. Each flag below may also be set as
RELAY_BACKFILL_<FLAG> (e.g. RELAY_BACKFILL_QUEUE).

Flags:
`

// backfillEnv holds the RELAY_BACKFILL_* defaults for the flags.
type backfillEnv struct {
	Queue       string  `env:"RELAY_BACKFILL_QUEUE"`
	DeadLetter  string  `env:"RELAY_BACKFILL_DEAD_LETTER_QUEUE"`
	Prefetch    int     `env:"RELAY_BACKFILL_PREFETCH"` // 0: backfill.DefaultPrefetch
	Limit       int64   `env:"RELAY_BACKFILL_LIMIT, default=0"`
	Rate        float64 `env:"RELAY_BACKFILL_RATE, default=0"`
	SubjectMap  string  `env:"RELAY_BACKFILL_SUBJECT_MAP"`
	AllowOthers bool    `env:"RELAY_BACKFILL_ALLOW_OTHER_CONSUMERS, default=false"`
	Follow      bool    `env:"RELAY_BACKFILL_FOLLOW, default=false"`
	DryRun      bool    `env:"RELAY_BACKFILL_DRY_RUN, default=false"`
	JSON        bool    `env:"RELAY_BACKFILL_JSON, default=false"`
	MetricsAddr string  `env:"RELAY_BACKFILL_METRICS_ADDR"` // empty: no listener
}

// backfillFlags are backfill's flags, after the RELAY_BACKFILL_* defaults.
type backfillFlags struct {
	queue, dlq, metricsAddr             string
	prefetch                            int
	limit                               int64
	rate                                float64
	subjectMap                          map[string]string
	allowOthers, follow, dryRun, asJSON bool
}

func cmdBackfill(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	f, code, ok := parseBackfillFlags(args, stdout, stderr, env)
	if !ok {
		return code
	}
	if !amqpURLOK(env, stderr) {
		return exitUsage
	}
	ss, code := connectSession("backfill", stderr, env, 4, true, 0)
	if ss == nil {
		return code
	}
	defer ss.close()
	tp, stopTracing, err := setupTracing(context.Background(), env, ss.log)
	if err != nil {
		fmt.Fprintf(stderr, "relayd: config: %v\n", err)
		return exitUsage
	}
	defer stopTracing()
	return runBackfill(ss, f, tp, stdout, stderr)
}

// parseBackfillFlags reads the RELAY_BACKFILL_* defaults and the flags, and
// checks them; when not ok, the command exits with code.
func parseBackfillFlags(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) (f backfillFlags, code int, ok bool) {
	var be backfillEnv
	if err := noEmpty[backfillEnv](env); err != nil {
		fmt.Fprintf(stderr, "relayd: config: %v\n", err)
		return f, exitUsage, false
	}
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: &be, Lookuper: env}); err != nil {
		fmt.Fprintf(stderr, "relayd: config: %v\n", envError[backfillEnv](err, env))
		return f, exitUsage, false
	}
	if be.Prefetch == 0 {
		be.Prefetch = backfill.DefaultPrefetch
	}
	fs := flag.NewFlagSet("backfill", flag.ContinueOnError)
	fs.StringVar(&f.queue, "queue", be.Queue, "the legacy queue to drain (required)")
	fs.StringVar(&f.dlq, "dead-letter-queue", be.DeadLetter, "queue for messages JetStream refuses for good (must exist)")
	fs.IntVar(&f.prefetch, "prefetch", be.Prefetch, "unacked deliveries at once")
	fs.Int64Var(&f.limit, "limit", be.Limit, "stop after N messages (0: all)")
	fs.Float64Var(&f.rate, "rate", be.Rate, "at most R messages per second (0: no cap)")
	subjectMap := fs.String("subject-map", be.SubjectMap, "rewrite routing-key prefixes: from=to[,from=to...]")
	fs.BoolVar(&f.allowOthers, "allow-other-consumers", be.AllowOthers, "start even if other consumers share the queue")
	fs.BoolVar(&f.follow, "follow", be.Follow, "keep going after the queue is drained")
	fs.BoolVar(&f.dryRun, "dry-run", be.DryRun, "report what would happen; change nothing")
	fs.BoolVar(&f.asJSON, "json", be.JSON, "print the summary as JSON")
	fs.StringVar(&f.metricsAddr, "metrics-addr", be.MetricsAddr, "serve /metrics on host:port (unset: no listener)")
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, backfillHelp)); done {
		return f, code, false
	}
	if !f.valid(stderr) {
		return f, exitUsage, false
	}
	var err error
	if f.subjectMap, err = parseSubjectMap(*subjectMap); err != nil {
		fmt.Fprintf(stderr, "relayd backfill: --subject-map: %v\n", err)
		return f, exitUsage, false
	}
	return f, 0, true
}

// valid checks the flags' values, saying on stderr what is wrong.
func (f backfillFlags) valid(stderr io.Writer) bool {
	if f.queue == "" {
		fmt.Fprintln(stderr, "relayd backfill: --queue (or RELAY_BACKFILL_QUEUE) is required")
		return false
	}
	for _, c := range []struct {
		bad  bool
		name string
		want string
		val  any
	}{
		{f.prefetch < 0 || f.prefetch > 65535, "--prefetch (or RELAY_BACKFILL_PREFETCH)", "1..65535 (0: the default)", f.prefetch},
		{f.limit < 0, "--limit (or RELAY_BACKFILL_LIMIT)", "0 (all) or more", f.limit},
		{f.rate < 0, "--rate (or RELAY_BACKFILL_RATE)", "0 (no cap) or more", f.rate},
	} {
		if c.bad {
			fmt.Fprintf(stderr, "relayd backfill: %s: %v is out of range: want %s\n", c.name, c.val, c.want)
			return false
		}
	}
	if f.metricsAddr != "" && !validListenAddr(f.metricsAddr) {
		fmt.Fprintf(stderr, "relayd backfill: --metrics-addr (or RELAY_BACKFILL_METRICS_ADDR): %q is not host:port with a port of 0..65535\n", f.metricsAddr)
		return false
	}
	return true
}

// runBackfill runs the backfill on ss with its progress reported, prints
// the summary, and returns the exit code.
func runBackfill(ss *session, f backfillFlags, tp trace.TracerProvider, stdout, stderr io.Writer) int {
	cfg, log, ctx, pool, nc := ss.cfg, ss.log, ss.ctx, ss.pool, ss.nc
	if err := checkSchema(ctx, cfg, pool, log); err != nil {
		log.Error("backfill", "error", err.Error())
		return exitFailure
	}
	tlsCfg, err := cfg.amqpTLS()
	if err != nil {
		log.Error("backfill", "error", err.Error())
		return exitFailure
	}
	rep := newReporter(stderr, log)
	if f.metricsAddr != "" {
		served, reg := newMetricsRegistry(cfg.table)
		rep.register(reg)
		srv, err := startHTTP(f.metricsAddr, cfg.PProf, served, noProbe, nil, log)
		if err != nil {
			log.Error("backfill: --metrics-addr", "error", err.Error())
			return exitFailure
		}
		defer srv.Close()
	}
	sum, err := backfill.Run(ctx, backfill.Config{
		AMQPURL: cfg.AMQPURL, TLS: tlsCfg, Queue: f.queue, Prefetch: f.prefetch,
		NATS: nc, Stream: cfg.NATSStream, Routes: cfg.routes, SubjectPrefix: cfg.NATSSubjectPrefix, SubjectMap: f.subjectMap,
		DB: pool, Table: cfg.table, DeadLetterQueue: f.dlq,
		Follow: f.follow, DryRun: f.dryRun, Limit: f.limit, Rate: f.rate, AllowOtherConsumers: f.allowOthers,
		PublishTimeout: cfg.PublishTimeout, Logger: log, OnProgress: rep.update, TracerProvider: tp,
	})
	rep.finish()
	interrupted := errors.Is(err, context.Canceled)
	if err != nil && !interrupted {
		log.Error("backfill failed", "error", err.Error())
		printSummary(stdout, sum, f.asJSON)
		if errors.Is(err, backfill.ErrOtherConsumers) {
			return exitUsage
		}
		return exitFailure
	}
	if interrupted {
		log.Info("backfill interrupted: rerun to continue where it stopped")
	}
	printSummary(stdout, sum, f.asJSON)
	return exitOK
}

func parseSubjectMap(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		from, to, ok := strings.Cut(pair, "=")
		if !ok || from == "" {
			return nil, fmt.Errorf("%q: want from=to", pair)
		}
		m[from] = to
	}
	return m, nil
}

func printSummary(w io.Writer, s backfill.Summary, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(s) //nolint:errcheck // stdout
		return
	}
	title := "backfill"
	if s.DryRun {
		title = "backfill (dry run: nothing was changed; figures are what a run would do)"
	}
	fmt.Fprintf(w, "%s\n  moved:             %d\n  already delivered: %d\n  derived ids:       %d\n  duplicates:        %d\n  dead-lettered:     %d\n  failed (held):     %d\n  requeued (retry):  %d\n  rate:              %.0f msg/s\n  duration:          %s\n",
		title, s.Moved, s.AlreadyDelivered, s.Derived, s.Duplicates, s.DeadLettered, s.Failed, s.Requeued, s.Rate, s.Duration.Round(time.Millisecond))
}

// reporter shows progress: a bar on a terminal, a log line every 5 s
// otherwise, and the relayd_backfill_* metrics.
type reporter struct {
	mu   sync.Mutex
	last backfill.Progress
	line progressLine
}

func newReporter(w io.Writer, log *slog.Logger) *reporter {
	return &reporter{line: newProgressLine(w, log, "backfill")}
}

func (r *reporter) update(p backfill.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = p
	r.line.show(p.Handled(), p.QueueDepthAtStart, "handled", p.Handled(), "queue_depth_at_start", p.QueueDepthAtStart,
		"moved", p.Moved, "already_delivered", p.AlreadyDelivered, "dead_lettered", p.DeadLettered,
		"rate", fmt.Sprintf("%.0f/s", p.Rate))
}

func (r *reporter) finish() { r.line.finish() }

func (r *reporter) register(reg prometheus.Registerer) {
	get := func(f func(backfill.Progress) int64) func() float64 {
		return func() float64 {
			r.mu.Lock()
			defer r.mu.Unlock()
			return float64(f(r.last))
		}
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "relayd_backfill_moved_total", Help: "Messages moved to JetStream and acked on RabbitMQ."}, get(func(p backfill.Progress) int64 { return p.Moved })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "relayd_backfill_already_delivered_total", Help: "Messages JetStream already had (acked, not re-sent)."}, get(func(p backfill.Progress) int64 { return p.AlreadyDelivered })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "relayd_backfill_derived_ids_total", Help: "Moved messages that had no message-id."}, get(func(p backfill.Progress) int64 { return p.Derived })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "relayd_backfill_dead_lettered_total", Help: "Messages JetStream refused for good, parked in the dead-letter queue."}, get(func(p backfill.Progress) int64 { return p.DeadLettered })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "relayd_backfill_failed_total", Help: "Messages JetStream refused for good, held (no dead-letter queue)."}, get(func(p backfill.Progress) int64 { return p.Failed })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "relayd_backfill_requeued_total", Help: "Transient failures requeued for another try."}, get(func(p backfill.Progress) int64 { return p.Requeued })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "relayd_backfill_queue_depth_at_start", Help: "Ready messages in the queue when the run started."}, get(func(p backfill.Progress) int64 { return p.QueueDepthAtStart })),
	)
}
