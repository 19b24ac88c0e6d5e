package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/relay/natssink"
)

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
	// A host that does not answer at all (powered off, cut off) would hold
	// every connection attempt until its caller's deadline, and the next
	// host of a multi-host URL — the new primary — would never be tried.
	hosts := len(postgresHosts(pc))
	if hosts > 1 && pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = hostConnectTimeout
	}
	rp := pc.ConnConfig.RuntimeParams
	if rp["application_name"] == "" {
		rp["application_name"] = "relayd"
	}
	idle := 2*cfg.PublishTimeout + 30*time.Second
	rp["idle_in_transaction_session_timeout"] = strconv.FormatInt(idle.Milliseconds(), 10)
	// relayd's statements are short and repeated: were the claim ever run
	// on a generic plan, JIT would compile it on every execution.
	if rp["jit"] == "" {
		rp["jit"] = "off"
	}
	// A pooler in session mode told to ignore these startup parameters
	// (PgBouncer's ignore_startup_parameters) drops them: set them again.
	idleMS, jit := rp["idle_in_transaction_session_timeout"], rp["jit"]
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SELECT set_config('idle_in_transaction_session_timeout', $1, false), set_config('jit', $2, false)", idleMS, jit)
		return err
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
	attempt := max(waitAttempt, time.Duration(hosts)*pc.ConnConfig.ConnectTimeout)
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
			if errors.As(last, &pgErr) && poolerRefused(pgErr) {
				return nil, fmt.Errorf("postgres: %w: %s", last, errPooler)
			}
			return nil, fmt.Errorf("postgres: %w", last)
		}
		wait.failed(err)
		backoff.Sleep(cctx, 500*time.Millisecond)
	}
}

// errPooler says why relayd refuses a pooler that refused its session
// settings, and what works.
var errPooler = errors.New("a connection pooler refused relayd's session settings. relayd needs a session of its own " +
	"(LISTEN, its wake lock, row locks held through a batch): connect to Postgres directly, or through PgBouncer in session mode " +
	"with ignore_startup_parameters = idle_in_transaction_session_timeout, jit (relayd then sets them itself); " +
	"transaction and statement pooling cannot work (docs/deploying.md)")

// poolerRefused says whether a pooler, not Postgres, refused a startup
// parameter: PgBouncer's "unsupported startup parameter" (08P01).
func poolerRefused(e *pgconn.PgError) bool {
	return e.Code == "08P01" && strings.HasPrefix(e.Message, "unsupported startup parameter")
}

// startingUp says whether Postgres refused a connection for now only: it is
// starting up, shutting down or recovering (SQLSTATE class 57P: 57P01
// admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now).
func startingUp(e *pgconn.PgError) bool {
	return strings.HasPrefix(e.Code, "57P")
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
		nats.ErrorHandler(natssink.ErrorHandler(log)),
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
		backoff.Sleep(ctx, 500*time.Millisecond)
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
