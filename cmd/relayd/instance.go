package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// reportInstance writes this relay's phase to <table>_instances every
// phase.BeatEvery until ctx is done, then removes it, so that `relayd
// status`, `cutover check`, the backfill and the replay see every running
// relay's phase; every phase.PruneEvery it forgets the relays long silent.
// ctx should end once the relay's batches have.
func reportInstance(ctx context.Context, pool *pgxpool.Pool, table schema.Table, r *relay.Relay, log *slog.Logger) {
	in := phase.Instance{Instance: instanceName(), Version: version, StartedAt: time.Now()}
	select { // not the phase the relay starts in, but the one it runs
	case <-r.PhaseRead():
	case <-ctx.Done():
		return
	}
	errs := errlog.New(log, "report this relay's phase")
	t := time.NewTicker(phase.BeatEvery)
	defer t.Stop()
	var pruned time.Time
	for {
		s := r.Phase()
		in.Phase, in.Pinned = reportedPhase(s), s.Pinned
		bctx, cancel := context.WithTimeout(ctx, phase.BeatEvery)
		err := phase.Beat(bctx, pool, table, in)
		if err == nil && time.Since(pruned) >= phase.PruneEvery {
			if err = phase.Prune(bctx, pool, table); err == nil {
				pruned = time.Now()
			}
		}
		if err != nil && ctx.Err() == nil {
			errs.Error(err)
		} else {
			errs.OK()
		}
		cancel()
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			phase.Leave(lctx, pool, table, in.Instance) //nolint:errcheck // the row ages out
			cancel()
			return
		case <-t.C:
		}
	}
}

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
