package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// instanceName names this process in <table>_instances: the host (a pod's
// name on Kubernetes) and the pid.
func instanceName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// phaseSource is what the report reads of the relay: the phase it runs,
// once it has read the table's.
type phaseSource interface {
	PhaseRead() <-chan struct{}
	Phase() relay.PhaseState
}

// presenceRetry paces the reconnections of the report's session.
var presenceRetry = backoff.Doubling{Floor: 100 * time.Millisecond, Cap: 5 * time.Second, Jitter: 0.5}

// instanceReport lists this relay in <table>_instances, on a session of its own
// whose presence lock says it runs, so that `relayd status`, `cutover
// check`, the backfill and the replay see every running relay's phase.
type instanceReport struct {
	pool  *pgxpool.Pool // whose config the session copies
	table schema.Table
	src   phaseSource
	every time.Duration // phase.BeatEvery: how often it looks at the phase
	log   *slog.Logger
	beat  func() // tests: after each look that reached Postgres
}

// reportInstance reports this relay until ctx is done, then removes its
// row. ctx should end once the relay's batches have.
func reportInstance(ctx context.Context, pool *pgxpool.Pool, table schema.Table, src phaseSource, log *slog.Logger) {
	rp := instanceReport{pool: pool, table: table, src: src, every: phase.BeatEvery, log: log, beat: func() {}}
	rp.run(ctx)
}

func (rp *instanceReport) run(ctx context.Context) {
	in := phase.Instance{Instance: instanceName(), Version: version, StartedAt: time.Now()}
	select { // not the phase the relay starts in, but the one it runs
	case <-rp.src.PhaseRead():
	case <-ctx.Done():
		return
	}
	errs := errlog.New(rp.log, "report this relay's phase")
	var pruned time.Time
	wait := time.Duration(0)
	for {
		reached, err := rp.session(ctx, &in, &pruned, errs)
		if ctx.Err() != nil {
			return
		}
		errs.Error(err)
		if reached {
			wait = 0
		}
		wait = presenceRetry.Next(wait)
		backoff.Sleep(ctx, presenceRetry.Wait(wait))
	}
}

// session reports in on one connection until it fails or ctx is done. Its
// row is rewritten only when the phase it reports changes; between, a ping
// finds a session gone. reached says whether the report was written.
func (rp *instanceReport) session(ctx context.Context, in *phase.Instance, pruned *time.Time, errs *errlog.Limiter) (reached bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, presenceConnectWait)
	conn, err := pgx.ConnectConfig(cctx, rp.pool.Config().ConnConfig.Copy())
	cancel()
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	var p *phase.Presence
	defer func() {
		// The row goes first: a row left behind is not listed once the
		// session ends, but waits for the prune.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if p != nil && ctx.Err() != nil {
			p.Leave(lctx, in.Instance) //nolint:errcheck // not listed without the session
		}
		conn.Close(lctx)
	}()
	pctx, cancel := context.WithTimeout(ctx, phase.BeatEvery)
	p, err = phase.Present(pctx, conn, rp.table)
	cancel()
	if err != nil {
		return false, err
	}
	t := time.NewTicker(rp.every)
	defer t.Stop()
	var written phase.Instance
	for {
		s := rp.src.Phase()
		in.Phase, in.Pinned = reportedPhase(s), s.Pinned
		bctx, cancel := context.WithTimeout(ctx, phase.BeatEvery)
		if !reached || in.Phase != written.Phase || in.Pinned != written.Pinned {
			err = p.Report(bctx, *in)
			reached, written = reached || err == nil, *in
		} else {
			err = p.Check(bctx)
		}
		if err == nil && time.Since(*pruned) >= phase.PruneEvery {
			if err = p.Prune(bctx); err == nil {
				*pruned = time.Now()
			}
		}
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return reached, nil
			}
			return reached, err
		}
		errs.OK()
		rp.beat()
		select {
		case <-ctx.Done():
			return reached, nil
		case <-t.C:
		}
	}
}

// presenceConnectWait bounds a connect of the report's session.
const presenceConnectWait = 10 * time.Second

// reportedPhase is the phase the relay's row says it runs: while batches of
// an earlier phase are in flight, that one.
func reportedPhase(s relay.PhaseState) phase.Name {
	if s.Finishing != nil {
		return phase.Of(s.Finishing)
	}
	return phase.Of(s.Running)
}

// runningPhaseLine says, for /readyz, which phase the relay runs and why.
func runningPhaseLine(s relay.PhaseState) string {
	line := "phase " + string(phase.Of(s.Running))
	switch {
	case s.Pinned:
		line += " (pinned by RELAY_TARGETS)"
	case s.Table == nil:
		line += " (no phase set on the table: relayd phase set)"
	default:
		line += " (the table's)"
	}
	if s.Mismatch() {
		line += "; the table's phase is " + string(phase.Of(s.Table))
	}
	if s.Finishing != nil {
		line += "; batches of phase " + string(phase.Of(s.Finishing)) + " still in flight"
	}
	return line
}
