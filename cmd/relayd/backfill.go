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

// backfillCommand is relayd backfill.
type backfillCommand struct {
	*cli
	backfillFlags
}

// flags is backfill's flag set, into c, its defaults the RELAY_BACKFILL_*
// variables' (be); it returns --subject-map.
func (c *backfillCommand) flags(be backfillEnv) (*flag.FlagSet, *string) {
	if be.Prefetch == 0 {
		be.Prefetch = backfill.DefaultPrefetch
	}
	f := &c.backfillFlags
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
	return fs, subjectMap
}

// env reads the RELAY_BACKFILL_* defaults of the flags.
func (c *backfillCommand) backfillEnv() (backfillEnv, error) {
	var be backfillEnv
	if err := noEmpty[backfillEnv](c.env); err != nil {
		return be, err
	}
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: &be, Lookuper: c.env}); err != nil {
		return be, envError[backfillEnv](err, c.env)
	}
	return be, nil
}

// Usage lists the flags with the defaults the environment gives them.
func (c *backfillCommand) Usage() string {
	be, _ := c.backfillEnv()
	fs, _ := c.flags(be)
	return withFlagDefaults(fs, backfillHelp)
}

func (c *backfillCommand) Run(ctx context.Context, args []string) error {
	if err := c.parse(args); err != nil {
		return err
	}
	if err := amqpURLVar(c.env); err != nil {
		return err
	}
	ss, err := openSession(ctx, c.cli, sessionOptions{Conns: workerConns, NATS: true, Migrates: true})
	if err != nil {
		return err
	}
	defer ss.close()
	tp, stopTracing, err := setupTracing(ctx, c.env, ss.log)
	if err != nil {
		return asConfigError(err)
	}
	defer stopTracing()
	return runBackfill(ss, c.backfillFlags, tp, c.stdout, c.stderr)
}

// parse reads the RELAY_BACKFILL_* defaults and the flags, and checks them.
func (c *backfillCommand) parse(args []string) error {
	be, err := c.backfillEnv()
	if err != nil {
		return asConfigError(err)
	}
	fs, subjectMap := c.flags(be)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.valid(); err != nil {
		return err
	}
	if c.subjectMap, err = parseSubjectMap(*subjectMap); err != nil {
		return usagef("--subject-map: %v", err)
	}
	return nil
}

// valid checks the flags' values.
func (f backfillFlags) valid() error {
	if f.queue == "" {
		return usagef("--queue (or RELAY_BACKFILL_QUEUE) is required")
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
			return usagef("%s: %v is out of range: want %s", c.name, c.val, c.want)
		}
	}
	if f.metricsAddr != "" && !validListenAddr(f.metricsAddr) {
		return usagef("--metrics-addr (or RELAY_BACKFILL_METRICS_ADDR): %q is not host:port with a port of 0..65535", f.metricsAddr)
	}
	return nil
}

// runBackfill runs the backfill on ss with its progress reported, and
// prints the summary.
func runBackfill(ss *session, f backfillFlags, tp trace.TracerProvider, stdout, stderr io.Writer) error {
	cfg, log, ctx, pool, nc := ss.cfg, ss.log, ss.ctx, ss.pool, ss.nc
	if err := checkSchema(ctx, cfg, pool, log); err != nil {
		return logged("backfill", err)
	}
	tlsCfg, err := cfg.amqpTLS()
	if err != nil {
		return logged("backfill", err)
	}
	rep := newReporter(stderr, log)
	if f.metricsAddr != "" {
		served, reg := newMetricsRegistry(cfg.table)
		rep.register(reg)
		srv, err := startHTTP(f.metricsAddr, cfg.PProf, served, noProbe, nil, log)
		if err != nil {
			return logged("backfill: --metrics-addr", err)
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
		printSummary(stdout, sum, f.asJSON)
		return logged("backfill failed", err) // backfill.ErrOtherConsumers: exit 2
	}
	if interrupted {
		log.Info("backfill interrupted: rerun to continue where it stopped")
	}
	printSummary(stdout, sum, f.asJSON)
	return nil
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
