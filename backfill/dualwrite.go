package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/relay"
)

// checkDualWrite fails with ErrNotDualWrite when a running relay reports a
// phase without JetStream, the table's phase is amqp, or rows left the
// outbox without JetStream: at
// the first check, in the last dualWriteLookback, after the first that
// reached JetStream; then since the last check. The rows catch relays too
// old to report their phase.
func (b *runner) checkDualWrite(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	running, err := phase.Running(ctx, b.cfg.DB, b.cfg.Table)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	for _, in := range running {
		if in.Phase == phase.AMQP {
			how := "relayd phase set dual"
			if in.Pinned {
				how = "RELAY_TARGETS=amqp,nats (it is pinned)"
			}
			return fmt.Errorf("%w: relayd instance %s runs phase amqp, and the messages it has in flight would reach JetStream by neither it nor the backfill; put it in dual write (%s), then run the backfill",
				ErrNotDualWrite, in.Instance, how)
		}
	}
	// The relays that follow the table run its phase, those not running yet too.
	c, set, err := phase.Read(ctx, b.cfg.DB, b.cfg.Table)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if set && c.Phase == phase.AMQP {
		return fmt.Errorf("%w: the outbox's phase is amqp: the relays that follow it send nothing to JetStream, and the messages they have in flight would reach it by neither them nor the backfill; start dual write (relayd phase set dual), then run the backfill",
			ErrNotDualWrite)
	}
	return b.checkFinishedWithoutNATS(ctx)
}

// checkFinishedWithoutNATS is checkDualWrite's look at the rows.
func (b *runner) checkFinishedWithoutNATS(ctx context.Context) error {
	since := b.dualWriteAt
	if !since.IsZero() {
		// A record committed after the last check may bear an earlier
		// done_at; rows before the first that reached JetStream are
		// from before dual write.
		since = since.Add(-time.Minute)
		if since.Before(b.dualWriteFrom) {
			since = b.dualWriteFrom
		}
	}
	n, first, at, err := relay.FinishedWithoutNATS(ctx, b.cfg.DB, b.cfg.Table, dualWriteLookback, since)
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", b.cfg.Table.Delivered(), err)
	}
	if n > 0 {
		return fmt.Errorf("%w: %d rows left %s lately without reaching JetStream: a relayd instance runs phase amqp, and the messages it has in flight would reach JetStream by neither it nor the backfill; put every instance in dual write (relayd phase set dual; RELAY_TARGETS=amqp,nats for a pinned one), then run the backfill",
			ErrNotDualWrite, n, b.cfg.Table)
	}
	if b.dualWriteAt.IsZero() {
		b.dualWriteFrom = first
	}
	b.dualWriteAt, b.lastDualWrite = at, time.Now()
	return nil
}

// dualWriteLookback is how far back the first checkDualWrite looks (it
// walks the rows finished in it); the rechecks catch instances quiet then.
const dualWriteLookback = 2 * time.Minute

// dualWriteRecheck is how often a run checks that every instance is still
// in dual write (checkDualWrite).
const dualWriteRecheck = 30 * time.Second

// recheckDualWrite runs checkDualWrite every dualWriteRecheck during a
// run; it returns an error only when the run must stop.
func (b *runner) recheckDualWrite(ctx context.Context) error {
	if b.cfg.DryRun || time.Since(b.lastDualWrite) < dualWriteRecheck {
		return nil
	}
	b.lastDualWrite = time.Now()
	err := b.checkDualWrite(ctx)
	if errors.Is(err, ErrNotDualWrite) {
		b.log.Error("backfill: stopping: a relayd instance is not in dual write; messages of its rows in flight that this run skipped may not reach JetStream", "error", err.Error())
		return err
	}
	if err != nil {
		b.log.Warn("backfill: cannot check that the relays are in dual write", "error", err.Error())
	}
	return nil
}
