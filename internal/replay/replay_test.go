package replay

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
)

// A replay is refused while the table's phase is nats, or while a running
// relay runs nats (pinned by RELAY_TARGETS): that relay would keep finishing
// rows on JetStream only. A dry run warns instead.
func TestCheckPhase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		table   phase.Name
		relays  map[string]phase.Name // instance → the phase it reports
		pinned  bool
		dryRun  bool
		wantErr []error
		wantIn  []string
	}{
		{"dual, relays dual", phase.Dual, map[string]phase.Name{"a:1": phase.Dual}, false, false, nil, nil},
		{"dual, no relay", phase.Dual, nil, false, false, nil, nil},
		{"the table in nats", phase.NATS, nil, false, false, []error{ErrPhaseNATS}, nil},
		{"a relay pinned to nats", phase.Dual, map[string]phase.Name{"a:1": phase.Dual, "b:2": phase.NATS}, true, false,
			[]error{ErrRelayNATS}, []string{"b:2", "RELAY_TARGETS"}},
		{"both", phase.NATS, map[string]phase.Name{"b:2": phase.NATS, "c:3": phase.NATS}, false, false,
			[]error{ErrPhaseNATS, ErrRelayNATS}, []string{"b:2, c:3"}},
		{"a dry run warns", phase.Dual, map[string]phase.Name{"b:2": phase.NATS}, true, true, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := testenv.Pool(t)
			table := testenv.Outbox(t, pool)
			if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: tc.table, ChangedBy: "test", Reason: "test", Forced: tc.table == phase.NATS}, phase.Change{}, false); err != nil {
				t.Fatal(err)
			}
			for in, p := range tc.relays {
				if err := phase.Beat(ctx, pool, table, phase.Instance{Instance: in, Phase: p, Pinned: tc.pinned && p == phase.NATS,
					Version: "test", StartedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			var logged strings.Builder
			r := &runner{cfg: Config{DB: pool, Table: table, DryRun: tc.dryRun}, log: slog.New(slog.NewTextHandler(&logged, nil))}
			err := r.checkPhase(ctx)
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("checkPhase: %v, want nil", err)
			}
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("checkPhase: %v, want %v", err, want)
				}
			}
			for _, s := range tc.wantIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("checkPhase: %q does not name %q", err, s)
				}
			}
			if tc.dryRun && !strings.Contains(logged.String(), ErrRelayNATS.Error()) {
				t.Errorf("the dry run did not warn:\n%s", logged.String())
			}
		})
	}
}
