package cutover_test

import (
	"context"
	"errors"
	"testing"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/schema"
)

// SetPhase runs the check, every consumer required, before a move to nats
// that is not forced, and records nothing unless it passes; a Result made
// by hand, not by Check, clears nothing.
func TestSetPhaseChecksBeforeNATS(t *testing.T) {
	ctx := context.Background()
	table := schema.Table{Name: "outbox"}
	cfg := cutover.Config{Table: table} // no DB: nothing may be recorded
	to := phase.Change{Phase: phase.NATS, ChangedBy: "a@h"}
	from := phase.Change{Phase: phase.Dual}

	var checked []cutover.Config
	failing := func(_ context.Context, c cutover.Config) (cutover.Result, error) {
		checked = append(checked, c)
		return cutover.Result{OK: false, Conditions: []cutover.Condition{{Name: cutover.CondQueue, Detail: "1 ready"}}}, nil
	}
	_, res, err := cutover.SetPhase(ctx, cfg, to, from, true, failing)
	if !errors.Is(err, cutover.ErrNotReady) || res.OK || len(res.Failed()) != 1 {
		t.Errorf("a failing check: %+v, %v; want its verdict and ErrNotReady", res, err)
	}
	if len(checked) != 1 || !checked[0].AllConsumers {
		t.Errorf("the check ran with %+v, want once with AllConsumers", checked)
	}

	forged := func(context.Context, cutover.Config) (cutover.Result, error) { return cutover.Result{OK: true}, nil }
	if _, _, err := cutover.SetPhase(ctx, cfg, to, from, true, forged); !errors.Is(err, phase.ErrUnchecked) {
		t.Errorf("a Result made by hand: %v, want phase.ErrUnchecked", err)
	}
	if (cutover.Result{OK: true}).Clears(table) {
		t.Error("a Result made by hand clears a move to nats")
	}

	boom := errors.New("postgres did not answer")
	broken := func(context.Context, cutover.Config) (cutover.Result, error) { return cutover.Result{}, boom }
	if _, _, err := cutover.SetPhase(ctx, cfg, to, from, true, broken); !errors.Is(err, boom) {
		t.Errorf("a check that could not be made: %v, want its error", err)
	}
}
