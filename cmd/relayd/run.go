package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/metrics"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/natssink"
	"github.com/relayd/relayd/schema"
)

const runHelp = `Usage: relayd run

Relays every committed row of the outbox table to the targets in
RELAY_TARGETS (amqp, nats or amqp,nats) until SIGINT or SIGTERM. On the first
signal it stops claiming and lets in-flight batches finish; a second signal
exits at once.

At start it checks that the table is migrated, the JetStream stream and the
RabbitMQ exchange exist; with RELAY_PROVISION=true it creates whatever is
missing instead. Serves /metrics, /healthz, /readyz and /version on
RELAY_METRICS_ADDR. While Postgres, RabbitMQ or NATS does not answer, it
logs which, where and why every few seconds, for up to
RELAY_STARTUP_TIMEOUT.
`

func cmdRun(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	if code, done := parseFlags(fs, args, stdout, stderr, runHelp); done {
		return code
	}
	cfg, code := configOrExit(stderr, env)
	if cfg == nil {
		return code
	}
	if err := cfg.validateRun(); err != nil {
		fmt.Fprintf(stderr, "relayd: config: %v\n", err)
		return exitUsage
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signalContext(log)
	defer stop()
	if err := serve(ctx, cfg, log); err != nil {
		if ctx.Err() != nil && !errors.Is(err, errShutdownTimeout) {
			// A signal while starting (waiting for Postgres or a broker):
			// nothing was claimed, so nothing is left to finish.
			log.Info("relayd stopped before it had started", "error", err.Error())
			return exitOK
		}
		log.Error("relayd failed", "error", err.Error())
		return exitFailure
	}
	return exitOK
}

// poolCloseWait bounds the wait for the Postgres connections to close at
// exit.
const poolCloseWait = 2 * time.Second

// errShutdownTimeout: in-flight batches outlasted RELAY_SHUTDOWN_TIMEOUT.
var errShutdownTimeout = errors.New("in-flight batches did not finish within RELAY_SHUTDOWN_TIMEOUT")

// newPool is connectPostgres without a log of the wait.
func newPool(ctx context.Context, cfg *config, maxConns int32) (*pgxpool.Pool, error) {
	return connectPostgres(ctx, cfg, maxConns, slog.New(slog.DiscardHandler))
}

// connectPostgres connects to Postgres, waiting for it up to
// cfg.StartupTimeout and logging the wait. Relay sessions carry an
// idle_in_transaction_session_timeout so that a relay frozen mid-batch
// (SIGSTOP, a stuck broker write) cannot hold its rows' locks for ever.
func connectPostgres(ctx context.Context, cfg *config, maxConns int32, log *slog.Logger) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("RELAY_DATABASE_URL cannot be parsed")
	}
	pc.MaxConns = maxConns
	rp := pc.ConnConfig.RuntimeParams
	if rp["application_name"] == "" {
		rp["application_name"] = "relayd"
	}
	idle := 2*cfg.PublishTimeout + 30*time.Second
	rp["idle_in_transaction_session_timeout"] = strconv.FormatInt(idle.Milliseconds(), 10)
	// relayd's statements are short and repeated: were the claim ever run
	// on a generic plan, JIT would compile it on every execution (~300 ms).
	if rp["jit"] == "" {
		rp["jit"] = "off"
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, pc)
	if err != nil {
		return nil, err
	}
	// Postgres may still be starting (a compose or pod start, a restart or
	// crash recovery): retry until RELAY_STARTUP_TIMEOUT — unless Postgres
	// itself answered with an error that waiting does not fix
	// (authentication, no such database). The error reported is the last
	// real one, not the deadline's.
	var last error
	wait := newWaitLog(log, "postgres", postgresForLog(pc), cfg.StartupTimeout)
	attempt := max(waitAttempt, pc.ConnConfig.ConnectTimeout)
	for {
		began := time.Now()
		actx, cancelAttempt := context.WithTimeout(cctx, attempt)
		err := pool.Ping(actx)
		timedOut := errors.Is(actx.Err(), context.DeadlineExceeded)
		cancelAttempt()
		if err == nil {
			wait.reached()
			return pool, nil
		}
		if timedOut {
			err = fmt.Errorf("no answer within %s: %w", time.Since(began).Round(100*time.Millisecond), err)
		}
		if cctx.Err() == nil || last == nil {
			last = err
		}
		var pgErr *pgconn.PgError
		if (errors.As(err, &pgErr) && !startingUp(pgErr)) || cctx.Err() != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", last)
		}
		wait.failed(err)
		select {
		case <-cctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// startingUp says whether Postgres refused a connection for now only: it is
// starting up, shutting down or recovering (SQLSTATE class 57P: 57P01
// admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now).
func startingUp(e *pgconn.PgError) bool {
	return strings.HasPrefix(e.Code, "57P")
}

func serve(ctx context.Context, cfg *config, log *slog.Logger) error {
	pool, err := connectPostgres(ctx, cfg, int32(cfg.Workers+4), log)
	if err != nil {
		return err
	}
	closePool := true
	defer func() {
		// Not after RELAY_SHUTDOWN_TIMEOUT: Close waits for every
		// connection in use, and the batches holding them are what did
		// not finish. And not for long: it also waits for the cancel
		// request pgx sends for a query cut short, which a Postgres that
		// does not answer leaves hanging for 15 s. Exiting closes them.
		if !closePool {
			return
		}
		closed := make(chan struct{})
		go func() { pool.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(poolCloseWait):
			log.Warn("Postgres connections not closed in time; exiting anyway", "waited", poolCloseWait.String())
		}
	}()

	if err := checkSchema(ctx, cfg, pool, log); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	m := metrics.NewRelay(reg, version)

	var sinks []relay.Sink
	for _, t := range cfg.targets {
		switch t {
		case relay.TargetNATS:
			nc, err := connectNATS(ctx, cfg, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			sctx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
			found, err := natssink.EnsureStream(sctx, nc, cfg.NATSStream, cfg.NATSSubjectPrefix, cfg.NATSDupWindow, cfg.Provision)
			cancel()
			if err != nil {
				return err
			}
			if found.Warning != "" {
				log.Warn("nats: " + found.Warning)
			}
			s, err := natssink.New(natssink.Config{
				Conn: nc, Stream: cfg.NATSStream, SubjectPrefix: cfg.NATSSubjectPrefix,
				AckTimeout: cfg.PublishTimeout, DuplicateWindow: found.DuplicateWindow, OnDuplicate: m.Duplicate, Logger: log,
			})
			if err != nil {
				return err
			}
			sinks = append(sinks, s)
		case relay.TargetAMQP:
			tlsCfg, err := cfg.amqpTLS()
			if err != nil {
				return err
			}
			sctx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
			// RabbitMQ may still be starting: retry what a refused or
			// reset connection fails, until RELAY_STARTUP_TIMEOUT.
			wait := newWaitLog(log, "rabbitmq", redactURL(cfg.AMQPURL), cfg.StartupTimeout)
			for {
				err = amqpsink.EnsureExchange(sctx, cfg.AMQPURL, tlsCfg, cfg.AMQPExchange, cfg.Provision)
				var netErr *net.OpError
				if err == nil || !errors.As(err, &netErr) {
					if err == nil {
						wait.reached()
					}
					break
				}
				wait.failed(err)
				select {
				case <-sctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
				if sctx.Err() != nil {
					break // with the last dial's error
				}
			}
			if err != nil {
				cancel()
				return err
			}
			s, err := amqpsink.New(sctx, amqpsink.Config{URL: cfg.AMQPURL, Exchange: cfg.AMQPExchange, TLS: tlsCfg, Logger: log})
			cancel()
			if err != nil {
				return err
			}
			defer s.Close()
			sinks = append(sinks, s)
		}
	}

	r, err := relay.New(pool, relay.Config{
		Table:          cfg.table,
		Sinks:          sinks,
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
	})
	if err != nil {
		return err
	}

	ob := metrics.NewOutbox(reg)
	go ob.Run(ctx, cfg.StatsInterval, func(ctx context.Context) ([]relay.TargetStats, error) {
		return relay.ReadStats(ctx, pool, cfg.table, cfg.targets)
	}, log)

	if cfg.MetricsAddr != "" {
		srv, err := startHTTP(cfg.MetricsAddr, cfg.PProf, reg, readiness(pool, r), log)
		if err != nil {
			return fmt.Errorf("RELAY_METRICS_ADDR: %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			srv.Shutdown(sctx) //nolint:errcheck // best effort at exit
		}()
	}
	log.Info("relayd running", "version", version, "targets", cfg.Targets, "table", cfg.table.String(),
		"nats_url", redact(cfg.NATSURL), "amqp_url", redactURL(cfg.AMQPURL))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(cfg.ShutdownGrace):
		closePool = false
		return fmt.Errorf("%w=%s; their rows will be published again", errShutdownTimeout, cfg.ShutdownGrace)
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
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if cfg.Provision {
		_, err := schema.Up(ctx, db, cfg.table, log)
		return err
	}
	pending, err := schema.Pending(ctx, db, cfg.table)
	if err != nil {
		return fmt.Errorf("check migrations of %s: %w", cfg.table, err)
	}
	if pending {
		return fmt.Errorf("outbox table %s is not migrated: run `relayd migrate` (or set RELAY_PROVISION=true)", cfg.table)
	}
	return nil
}

func connectNATS(ctx context.Context, cfg *config, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("relayd"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		// Notice a silent server within ~15 s (default: minutes).
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.Timeout(5 * time.Second),
		// A write into a server that does not read gives up within a
		// publish timeout (default: a minute). nats.go flushes a full
		// buffer inside Publish, holding the connection's lock: a stalled
		// server held the batch past its own deadline, its record then
		// failed, and RabbitMQ's confirms of that batch were lost with it.
		nats.FlusherTimeout(cfg.PublishTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("nats reconnected") }),
	}
	if cfg.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	}
	if cfg.NATSNKey != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNKey)
		if err != nil {
			return nil, fmt.Errorf("RELAY_NATS_NKEY: %w", err)
		}
		opts = append(opts, o)
	}
	if cfg.NATSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSCA))
	}
	if cfg.NATSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.NATSCert, cfg.NATSKey))
	}
	deadline := time.Now().Add(cfg.StartupTimeout)
	wait := newWaitLog(log, "nats", redact(cfg.NATSURL), cfg.StartupTimeout)
	for {
		nc, err := nats.Connect(cfg.NATSURL, opts...)
		if err == nil {
			wait.reached()
			return nc, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil || refusedForGood(err) {
			return nil, fmt.Errorf("nats: connect to %s: %w", redact(cfg.NATSURL), err)
		}
		wait.failed(err)
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// refusedForGood: the NATS server answered and refused us — our
// credentials, or a certificate one side rejects. Waiting for it to start
// does not fix that: fail at once (RELAY_STARTUP_TIMEOUT is for a server not
// yet listening).
func refusedForGood(err error) bool {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// readiness reports what relayd depends on and cannot use: Postgres, and
// each enabled broker that is disconnected or that the relay paused after
// failed publishes. Empty means ready.
func readiness(pool *pgxpool.Pool, r *relay.Relay) func(context.Context) []string {
	return func(ctx context.Context) []string {
		var down []string
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			down = append(down, "postgres: "+err.Error())
		}
		return append(down, r.Unready()...)
	}
}

func startHTTP(addr string, pprofOn bool, reg *prometheus.Registry, ready func(context.Context) []string, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if down := ready(r.Context()); len(down) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, d := range down {
				fmt.Fprintln(w, d)
			}
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/version", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, version+"\n") })
	if pprofOn {
		// Go's profiler, for finding where time goes (go tool pprof
		// http://ADDR/debug/pprof/profile). Off by default: it is not for
		// the open network.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "error", err.Error())
		}
	}()
	log.Info("metrics listening", "addr", ln.Addr().String())
	return srv, nil
}
