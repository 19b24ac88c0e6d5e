package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/outboxsql"
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
	if cfg.databasePassword != "" {
		// One password for every host and TLS fallback: pgx keeps it here.
		pc.ConnConfig.Password = cfg.databasePassword
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
		_, err := c.Exec(ctx, outboxsql.SessionSettings, pgx.StrictStructArgs(outboxsql.SessionSettingsParams{IdleTimeout: idleMS, JIT: jit}))
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

// connectNATS connects to NATS, waiting for it up to cfg.StartupTimeout and
// logging the wait, then the connection's disconnects and reconnects.
func connectNATS(ctx context.Context, cfg *config, log *slog.Logger) (*nats.Conn, error) {
	return dialNATS(ctx, cfg, log, log)
}

// dialNATS is connectNATS logging the wait to waitLog.
func dialNATS(ctx context.Context, cfg *config, log, waitLog *slog.Logger) (*nats.Conn, error) {
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
	wait := newWaitLog(waitLog, "nats", redact(cfg.NATSURL), cfg.StartupTimeout)
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

// A one-shot command (status, migrate, tail...) that cannot connect prints
// one plain line, for the engineer who ran it; relayd run logs the error
// instead, for whatever collects its logs.

// postgresFailure is connectFailure for Postgres, which relayd retried for
// cfg.StartupTimeout unless Postgres answered.
func postgresFailure(cfg *config, err error) string {
	addr := "RELAY_DATABASE_URL"
	if pc, perr := pgxpool.ParseConfig(cfg.DatabaseURL); perr == nil {
		addr = strings.Join(postgresHosts(pc), ",")
	}
	return connectFailure("Postgres", addr, cfg.StartupTimeout, err)
}

// natsFailure is connectFailure for NATS, which connectNATS retried for
// cfg.StartupTimeout unless the server refused relayd.
func natsFailure(cfg *config, err error) string {
	return connectFailure("NATS", urlHosts(natsURLs(cfg.NATSURL)), cfg.StartupTimeout, err)
}

// amqpFailure is connectFailure for RabbitMQ; waited is how long relayd
// retried (0: one attempt).
func amqpFailure(cfg *config, waited time.Duration, err error) string {
	return connectFailure("RabbitMQ", urlHosts(amqpio.SplitURLs(cfg.AMQPURL)), waited, err)
}

// connectFailure says, on one line, which service at which address (never
// a password) could not be connected to, and why: "Postgres at
// 127.0.0.1:5432 did not answer within 5s: dial tcp …: connection refused".
func connectFailure(service, addr string, waited time.Duration, err error) string {
	var what string
	switch {
	case refusedUs(err):
		what = fmt.Sprintf("%s at %s refused the connection", service, addr)
	case !silent(err):
		what = fmt.Sprintf("could not connect to %s at %s", service, addr)
	case waited > 0:
		what = fmt.Sprintf("%s at %s did not answer within %s", service, addr, waited)
	default:
		what = fmt.Sprintf("%s at %s did not answer", service, addr)
	}
	if reason := connectReason(err); reason != "" {
		return what + ": " + reason
	}
	return what
}

// refusedUs says whether the server answered, and refused relayd's
// connection: its credentials, its database, its session settings.
func refusedUs(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || refusedForGood(err) ||
		errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost) || errors.Is(err, amqp.ErrSASL)
}

// unreachableErr says whether err is a connection failure connectFailure
// describes: a server that did not answer or refused the connection.
func unreachableErr(err error) bool {
	return refusedUs(err) || silent(err)
}

// silent says whether err is a server that did not answer: nothing
// listening, no route, or no answer in time.
func silent(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout)
}

// connectReason is the cause of a connection error, without the prefixes
// of its wrappers (pgconn's "failed to connect to `user=… database=…`:"),
// on one line; "" when it is only a deadline, which connectFailure says.
func connectReason(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if poolerRefused(pgErr) {
			return pgErr.Error() + ": " + errPooler.Error()
		}
		return pgErr.Error()
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return opErr.Error()
	}
	if errors.Is(err, nats.ErrNoServers) {
		// nats.go says so when every server refused the connection.
		return "connection refused (" + nats.ErrNoServers.Error() + ")"
	}
	for {
		var next error
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			next = u.Unwrap()
		case interface{ Unwrap() []error }:
			if es := u.Unwrap(); len(es) > 0 {
				next = es[0]
			}
		}
		if next == nil && errors.Is(err, context.DeadlineExceeded) {
			return ""
		}
		if next == nil {
			return strings.ReplaceAll(err.Error(), "\n", " ")
		}
		err = next
	}
}
