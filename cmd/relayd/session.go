package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// session is what the one-shot commands (status, phase, outbox, backfill,
// replay, cutover, verify) share: the configuration, a logger, a context
// cancelled by the first signal, a small Postgres pool and, when asked for,
// NATS.
type session struct {
	cfg    *config
	log    *slog.Logger
	ctx    context.Context
	pool   *pgxpool.Pool
	nc     *nats.Conn
	js     jetstream.JetStream
	cancel context.CancelFunc
}

// The Postgres pool sizes of the one-shot commands.
const (
	// readerConns: status, phase, outbox, cutover check and verify read one
	// statement at a time; verify holds a second connection for its
	// temporary table while it reads the outbox on the first.
	readerConns = 2
	// workerConns: backfill and replay work on several statements at once:
	// backfill processes batches of deliveries concurrently, each recording
	// what it moved; replay holds its run's advisory lock on a connection of
	// its own while it reads and records its progress.
	workerConns = 4
)

// sessionOptions says what a one-shot command's session connects to.
type sessionOptions struct {
	// Conns is the Postgres pool's size: readerConns or workerConns.
	Conns int32
	// NATS connects to NATS and JetStream too, for the commands that read
	// the stream: RELAY_NATS_URL and RELAY_NATS_STREAM are then required
	// whatever the relay's targets.
	NATS bool
	// ConnectTimeout is how long to wait for each service, the outcome
	// printed only; 0 waits RELAY_STARTUP_TIMEOUT, logging the wait as
	// relayd run does (backfill).
	ConnectTimeout time.Duration
	// Migrates says the command checks the table itself (checkSchema),
	// migrating it under RELAY_PROVISION; others have it checked here.
	Migrates bool
}

// openSession loads the configuration and connects, as opts says. A
// service it could not reach is an error of one line naming the service
// and its address (exitCode adds the command's name).
func openSession(ctx context.Context, c *cli, opts sessionOptions) (*session, error) {
	cfg, err := c.config(c.env)
	if err != nil {
		return nil, err
	}
	if opts.ConnectTimeout > 0 {
		cfg.StartupTimeout = opts.ConnectTimeout
	}
	if opts.NATS {
		// The target may be off for the relay; these commands need it anyway.
		if err := checkNATSURL(cfg.NATSURL); err != nil {
			return nil, asConfigError(fmt.Errorf("RELAY_NATS_URL: %w", err))
		}
		if err := cfg.needStream(); err != nil {
			return nil, asConfigError(err)
		}
	}
	s := &session{cfg: cfg, log: c.log}
	s.ctx, s.cancel = signalContext(ctx, s.log)
	// A command given --connect-timeout prints the outcome only: the engineer
	// chose the wait. One without (backfill) logs it, as relayd run does.
	waitLog := s.log
	if opts.ConnectTimeout > 0 {
		waitLog = slog.New(slog.DiscardHandler)
	}
	if s.pool, err = connectPostgres(s.ctx, cfg, opts.Conns, waitLog); err != nil {
		s.close()
		return nil, errors.New(postgresFailure(cfg, err))
	}
	if opts.NATS {
		if s.nc, err = dialNATS(s.ctx, cfg, s.log, waitLog); err != nil {
			s.close()
			return nil, errors.New(natsFailure(cfg, err))
		}
		if s.js, err = jetstream.New(s.nc); err != nil {
			s.close()
			return nil, logged("nats: jetstream", err)
		}
	}
	if !opts.Migrates {
		if err := requireSchema(s.ctx, cfg, s.pool); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

func (s *session) close() {
	if s.nc != nil {
		s.nc.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	s.cancel()
}
