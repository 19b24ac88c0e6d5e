package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sethvargo/go-envconfig"
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

// connectSession loads the configuration and connects, waiting
// connectTimeout for each service (0: RELAY_STARTUP_TIMEOUT). On failure
// it has printed why — a service it could not reach as one line naming the
// command (name, e.g. "outbox parked"), the service and its address — and
// returns the exit code; the caller returns it.
func connectSession(name string, stderr io.Writer, env envconfig.Lookuper, poolSize int32, withNATS bool, connectTimeout time.Duration) (*session, int) {
	cfg, code := configOrExit(stderr, env)
	if cfg == nil {
		return nil, code
	}
	if connectTimeout > 0 {
		cfg.StartupTimeout = connectTimeout
	}
	if withNATS {
		// The target may be off for the relay; these commands need it anyway.
		if err := checkNATSURL(cfg.NATSURL); err != nil {
			fmt.Fprintf(stderr, "relayd: config: RELAY_NATS_URL: %v\n", err)
			return nil, exitUsage
		}
		if err := cfg.needStream(); err != nil {
			fmt.Fprintf(stderr, "relayd: config: %v\n", err)
			return nil, exitUsage
		}
	}
	s := &session{cfg: cfg, log: newLogger(cfg, stderr)}
	s.ctx, s.cancel = signalContext(s.log)
	// A command given --connect-timeout prints the outcome only: the engineer
	// chose the wait. One without (backfill) logs it, as relayd run does.
	waitLog := s.log
	if connectTimeout > 0 {
		waitLog = slog.New(slog.DiscardHandler)
	}
	var err error
	if s.pool, err = connectPostgres(s.ctx, cfg, poolSize, waitLog); err != nil {
		fmt.Fprintln(stderr, commandPrefix(name)+postgresFailure(cfg, err))
		s.close()
		return nil, exitFailure
	}
	if withNATS {
		if s.nc, err = dialNATS(s.ctx, cfg, s.log, waitLog); err != nil {
			fmt.Fprintln(stderr, commandPrefix(name)+natsFailure(cfg, err))
			s.close()
			return nil, exitFailure
		}
		if s.js, err = jetstream.New(s.nc); err != nil {
			s.log.Error("nats: jetstream", "error", err.Error())
			s.close()
			return nil, exitFailure
		}
	}
	return s, exitOK
}

// commandPrefix starts a command's one-line message: "relayd status: ".
func commandPrefix(name string) string {
	if name == "" {
		return "relayd: "
	}
	return "relayd " + name + ": "
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
