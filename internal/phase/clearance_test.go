package phase_test

import (
	"context"
	"errors"
	"testing"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

// clearance is a cutover check's verdict as Set reads it: it clears one
// table, or none.
type clearance struct{ table *schema.Table }

func (c clearance) Clears(t schema.Table) bool { return c.table != nil && *c.table == t }

// A move to nats is recorded only cleared by a passing cutover check of
// the table, or forced: Set alone refuses it, before Postgres is asked.
func TestSetRefusesUncheckedNATS(t *testing.T) {
	ctx := context.Background()
	table := schema.Table{Name: "outbox"}
	other := schema.Table{Name: "other"}
	for name, set := range map[string]func() error{
		"Set": func() error {
			_, err := phase.Set(ctx, nil, table, phase.Change{Phase: phase.NATS, ChangedBy: "a@h"}, phase.Change{Phase: phase.Dual}, true)
			return err
		},
		"SetCleared, no clearance": func() error {
			_, err := phase.SetCleared(ctx, nil, table, phase.Change{Phase: phase.NATS, ChangedBy: "a@h"}, phase.Change{Phase: phase.Dual}, true, nil)
			return err
		},
		"SetCleared, a failed check": func() error {
			_, err := phase.SetCleared(ctx, nil, table, phase.Change{Phase: phase.NATS, ChangedBy: "a@h"}, phase.Change{Phase: phase.Dual}, true, clearance{})
			return err
		},
		"SetCleared, another table's check": func() error {
			_, err := phase.SetCleared(ctx, nil, table, phase.Change{Phase: phase.NATS, ChangedBy: "a@h"}, phase.Change{Phase: phase.Dual}, true, clearance{&other})
			return err
		},
	} {
		if err := set(); !errors.Is(err, phase.ErrUnchecked) {
			t.Errorf("%s: %v, want ErrUnchecked", name, err)
		}
	}
}

// Cleared or forced, the move to nats is recorded, forced ones as forced.
func TestSetNATSClearedOrForced(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.Dual, ChangedBy: "a@h"}, phase.Change{}, false); err != nil {
		t.Fatal(err)
	}
	from, _, err := phase.Read(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := phase.SetCleared(ctx, pool, table, phase.Change{Phase: phase.NATS, ChangedBy: "b@h"}, from, true, clearance{&table}); err != nil {
		t.Fatalf("a cleared move to nats: %v", err)
	}
	if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.Dual, ChangedBy: "c@h"}, phase.Change{}, false); !errors.Is(err, phase.ErrChanged) {
		t.Fatalf("from not set while nats: %v, want ErrChanged", err)
	}
	from, _, _ = phase.Read(ctx, pool, table)
	if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.Dual, ChangedBy: "c@h"}, from, true); err != nil {
		t.Fatal(err)
	}
	from, _, _ = phase.Read(ctx, pool, table)
	if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.NATS, ChangedBy: "d@h", Forced: true}, from, true); err != nil {
		t.Fatalf("a forced move to nats: %v", err)
	}
	h, err := phase.History(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 4 || h[1].Phase != phase.NATS || h[1].Forced || h[3].Phase != phase.NATS || !h[3].Forced {
		t.Errorf("history %+v: want dual, nats (cleared), dual, nats (forced)", h)
	}
}
