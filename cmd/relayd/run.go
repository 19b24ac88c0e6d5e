package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayd/relayd/internal/metrics"
	"github.com/relayd/relayd/internal/pghealth"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

const runHelp = `Usage: relayd run

Relays every committed row of the outbox table to the targets of the
table's phase (relayd phase set; both while none is set), or, when
RELAY_TARGETS is set (amqp, nats or amqp,nats), to those: it pins the
phase. Runs until SIGINT or SIGTERM. On the first
signal it stops claiming and lets in-flight batches finish; a second signal
exits at once.

At start it checks that the table is migrated, the JetStream stream and the
RabbitMQ exchange exist; with RELAY_PROVISION=true it creates whatever is
missing instead. Serves /metrics, /healthz, /readyz and /version on
RELAY_METRICS_ADDR, and there a read-only console at / unless
RELAY_CONSOLE=false. While Postgres, RabbitMQ or NATS does not answer, it
logs which, where and why every few seconds, for up to
RELAY_STARTUP_TIMEOUT.

Flags: none; relayd run reads the RELAY_* variables (docs/configuration.md).
`

// runCommand is relayd run: the relay.
type runCommand struct{ *cli }

func (c *runCommand) Usage() string {
	return withFlagDefaults(flag.NewFlagSet("run", flag.ContinueOnError), runHelp)
}

func (c *runCommand) Run(ctx context.Context, args []string) error {
	if err := parseFlags(flag.NewFlagSet("run", flag.ContinueOnError), args); err != nil {
		return err
	}
	cfg, err := c.config(c.env)
	if err != nil {
		return err
	}
	if err := cfg.validateRun(); err != nil {
		return asConfigError(err)
	}
	log := c.log
	tp, stopTracing, err := setupTracing(ctx, c.env, log)
	if err != nil {
		return asConfigError(err)
	}
	defer stopTracing() // after serve: the last batches' spans
	ctx, stop := signalContext(ctx, log)
	defer stop()
	if err := serve(ctx, cfg, log, tp); err != nil {
		if ctx.Err() != nil && !errors.Is(err, errShutdownTimeout) {
			// A signal while starting (waiting for Postgres or a broker):
			// nothing was claimed, so nothing is left to finish.
			log.Info("relayd stopped before it had started", "error", err.Error())
			return nil
		}
		return logged("relayd failed", err)
	}
	return nil
}

// poolCloseWait bounds the wait for the Postgres connections to close at
// exit.
const poolCloseWait = 2 * time.Second

// errShutdownTimeout: in-flight batches outlasted RELAY_SHUTDOWN_TIMEOUT.
var errShutdownTimeout = errors.New("in-flight batches did not finish within RELAY_SHUTDOWN_TIMEOUT")

// serve runs the relay until ctx is done and its in-flight batches have
// finished, or RELAY_SHUTDOWN_TIMEOUT has passed.
func serve(ctx context.Context, cfg *config, log *slog.Logger, tp trace.TracerProvider) error {
	// A connection per worker, and one each for the cleanup, late confirms,
	// stats, /readyz, the phase read, the instance report and the console.
	pool, err := connectPostgres(ctx, cfg, int32(cfg.Workers+7), log)
	if err != nil {
		return err
	}
	closePool := true
	defer func() {
		if closePool {
			closePoolBriefly(pool, log)
		}
	}()
	if err := checkSchema(ctx, cfg, pool, log); err != nil {
		return err
	}
	served, reg := newMetricsRegistry(cfg.table)
	m := metrics.NewRelay(reg, version)
	sinks, closeSinks, err := openSinks(ctx, cfg, m, log)
	defer closeSinks()
	if err != nil {
		return err
	}
	rc := relayConfig(cfg, sinks, m, log)
	rc.TracerProvider = tp
	rc.Phase = phase.Source{DB: pool, Table: cfg.table}
	r, err := relay.New(pool, rc)
	if err != nil {
		return err
	}
	m.WatchPaused(r.Paused)
	pg := metrics.NewPostgres(reg)
	go pg.Run(ctx, cfg.StatsInterval, func(ctx context.Context) (pghealth.Health, error) {
		return pghealth.Read(ctx, pool, cfg.table)
	}, log)
	readStats, routes := withConsole(cfg, pool, r, pg, reg)
	ob := metrics.NewOutbox(reg)
	go ob.Run(ctx, cfg.StatsInterval, readStats, log)
	// The report outlives ctx: a stopping relay's batches in flight still run
	// their phase. Its row goes once they end, before the pool closes.
	rctx, stopReport := context.WithCancel(context.WithoutCancel(ctx))
	reported := make(chan struct{})
	go func() { defer close(reported); reportInstance(rctx, pool, cfg.table, r, log) }()
	defer func() { stopReport(); <-reported }()
	if cfg.MetricsAddr != "" {
		srv, err := startHTTP(cfg.MetricsAddr, cfg.PProf, served, readiness(pool, r), routes, log)
		if err != nil {
			return fmt.Errorf("RELAY_METRICS_ADDR: %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			srv.Shutdown(sctx) //nolint:errcheck // best effort at exit
		}()
	}
	log.Info("relayd running", "version", version, "targets", cfg.targets, "pinned", cfg.pinned, "table", cfg.table.String(),
		"nats_url", redact(cfg.NATSURL), "amqp_url", redactAMQP(cfg.AMQPURL))
	timedOut, err := runRelay(ctx, r, cfg.ShutdownGrace)
	if timedOut {
		// The batches that did not finish still hold their connections:
		// Close would wait for them.
		closePool = false
	}
	return err
}

// withConsole returns the stats poll's read, teed into the console when it
// is served, and the console's routes: nil with RELAY_CONSOLE=false or no
// RELAY_METRICS_ADDR.
func withConsole(cfg *config, pool *pgxpool.Pool, r *relay.Relay, pg *metrics.Postgres, reg prometheus.Registerer) (
	readStats func(context.Context) ([]relay.TargetStats, error),
	routes func(*http.ServeMux),
) {
	if !cfg.Console || cfg.MetricsAddr == "" {
		return r.Stats, nil
	}
	// The console shows what the polls read: it reads no stats itself.
	figures := newConsoleFigures(time.Now)
	load, reads := pageLoader(pool, cfg.table, time.Now), metrics.NewConsoleReads(reg)
	cc := consoleConfig{
		Table: cfg.table, Interval: cfg.StatsInterval, Relay: r, Figures: figures, Health: pg.Last,
		Load: func(ctx context.Context) (pageData, error) {
			reads.Inc()
			return load(ctx)
		},
		Groups: cfg.consoleGroups, Self: instanceName(),
	}
	if len(cfg.consoleGroups) > 0 {
		cc.Check = consoleCutover(cfg, pool)
	}
	return figures.teeStats(r.Stats), newConsole(cc).register
}

// closePoolBriefly closes the pool, waiting at most poolCloseWait: Close
// also waits for the cancel request pgx sends for a query cut short, which a
// Postgres that does not answer leaves hanging for 15 s. Exiting closes them.
func closePoolBriefly(pool *pgxpool.Pool, log *slog.Logger) {
	closed := make(chan struct{})
	go func() { pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(poolCloseWait):
		log.Warn("Postgres connections not closed in time; exiting anyway", "waited", poolCloseWait.String())
	}
}

// runRelay runs r until ctx is done, then gives its in-flight batches grace
// to finish; timedOut says they did not.
func runRelay(ctx context.Context, r *relay.Relay, grace time.Duration) (timedOut bool, err error) {
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		return false, err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return false, err
	case <-time.After(grace):
		return true, fmt.Errorf("%w=%s; their rows will be published again", errShutdownTimeout, grace)
	}
}

// relayConfig maps the configuration onto relay.Config.
func relayConfig(cfg *config, sinks []relay.Sink, m *metrics.Relay, log *slog.Logger) relay.Config {
	return relay.Config{
		Table:          cfg.table,
		Sinks:          sinks,
		Targets:        cfg.targets,
		Routes:         cfg.routes,
		Pinned:         cfg.pinned,
		BatchSize:      cfg.BatchSize,
		Workers:        cfg.Workers,
		PublishTimeout: cfg.PublishTimeout,
		PollInterval:   cfg.PollInterval,
		Retention:      cfg.Retention,
		MaxAttempts:    maxAttempts(cfg.MaxAttempts),
		SkipParkedKeys: cfg.SkipParked,
		RetryMin:       cfg.RetryMin,
		RetryMax:       cfg.RetryMax,
		Logger:         log,
		Metrics:        m,
	}
}

// maxAttempts maps RELAY_MAX_ATTEMPTS (0: never park) to relay.Config's
// convention (negative: never).
func maxAttempts(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// checkSchema makes sure the table is migrated: with RELAY_PROVISION it
// migrates, otherwise it says what to run.
func checkSchema(ctx context.Context, cfg *config, pool *pgxpool.Pool, log *slog.Logger) error {
	if cfg.Provision {
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		_, err := schema.Up(ctx, db, cfg.table, log)
		return err
	}
	err := requireSchema(ctx, cfg, pool)
	if _, ok := errors.AsType[*schema.OutdatedError](err); ok {
		return fmt.Errorf("%w (or set RELAY_PROVISION=true)", err)
	}
	return err
}

// requireSchema is schema.Require for a command that reads the table and
// never migrates it: it runs on schema.Minimum and no older table.
func requireSchema(ctx context.Context, cfg *config, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return schema.Require(ctx, db, cfg.table)
}
