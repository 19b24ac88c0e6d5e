package cutover

import (
	"context"
	"errors"
	"time"

	"github.com/relayd/relayd/internal/phase"
)

// ErrNotReady: a move to nats whose cutover check did not pass. Nothing is
// recorded.
var ErrNotReady = errors.New("the cutover check does not pass")

// Checker runs the check for cfg: Check, or a caller's loop around it
// (relayd phase set --wait checks again until it passes).
type Checker func(context.Context, Config) (Result, error)

// SetPhase records c as cfg.Table's phase, in cfg.DB, unless the phase is
// no longer from (fromSet false: unless one was set), as phase.Set does.
// A move to nats that is not forced is recorded only once the cutover
// check passes: check (nil: Check) runs with every durable consumer of the
// groups' streams required, for phase nats leaves no group unchecked. The
// check's verdict is returned, and ErrNotReady when it did not pass; a
// move it did not run for returns a zero Result.
func SetPhase(ctx context.Context, cfg Config, c phase.Change, from phase.Change, fromSet bool, check Checker) (time.Time, Result, error) {
	if c.Phase != phase.NATS || c.Forced {
		at, err := phase.Set(ctx, cfg.DB, cfg.Table, c, from, fromSet)
		return at, Result{}, err
	}
	if check == nil {
		check = Check
	}
	cfg.AllConsumers = true
	res, err := check(ctx, cfg)
	switch {
	case err != nil:
		return time.Time{}, res, err
	case !res.OK:
		return time.Time{}, res, ErrNotReady
	}
	at, err := phase.SetCleared(ctx, cfg.DB, cfg.Table, c, from, fromSet, res)
	return at, res, err
}

var _ phase.Clearance = Result{}
