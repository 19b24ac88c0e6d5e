package cutover

import (
	"context"
	"fmt"
	"strings"

	"github.com/relayd/relayd/internal/phase"
)

// relaydPhases holds when every running relay writes to JetStream and, once
// the table's phase is set, runs it: a relay in amqp finishes rows JetStream
// never gets, and one pinned apart from the table will not follow the move.
// Relays too old to report are left to the outbox condition's look-back.
// tableNATS says the table's phase is nats.
func relaydPhases(ctx context.Context, cfg Config) (c Condition, tableNATS bool, err error) {
	running, err := phase.Running(ctx, cfg.DB, cfg.Table)
	if err != nil {
		return Condition{}, false, err
	}
	table, set, err := phase.Read(ctx, cfg.DB, cfg.Table)
	if err != nil {
		return Condition{}, false, err
	}
	tableNATS = set && table.Phase == phase.NATS
	tableSays := "the table's phase is not set"
	if set {
		tableSays = "the table's phase is " + string(table.Phase)
	}
	if len(running) == 0 {
		return Condition{Name: CondPhases, OK: true, Detail: "no relay reports its phase (relays before the phase table do not; the outbox condition covers them); " + tableSays}, tableNATS, nil
	}
	var bad []string
	counts := map[phase.Name]int{}
	for _, in := range running {
		counts[in.Phase]++
		how := "follows the table"
		if in.Pinned {
			how = "pinned by RELAY_TARGETS"
		}
		switch {
		case in.Phase != phase.Dual && in.Phase != phase.NATS:
			bad = append(bad, fmt.Sprintf("%s runs %s (%s): the rows it finishes skip JetStream", in.Instance, in.Phase, how))
		case set && in.Phase != table.Phase:
			bad = append(bad, fmt.Sprintf("%s runs %s (%s) while the table says %s", in.Instance, in.Phase, how, table.Phase))
		}
	}
	if len(bad) > 0 {
		return Condition{Name: CondPhases, Detail: strings.Join(bad, "; ")}, tableNATS, nil
	}
	var parts []string
	for _, n := range phase.Names {
		if counts[n] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[n], n))
		}
	}
	report := fmt.Sprintf("%d relays report", len(running))
	if len(running) == 1 {
		report = "1 relay reports"
	}
	return Condition{Name: CondPhases, OK: true, Detail: fmt.Sprintf("%s: %s; %s", report, strings.Join(parts, ", "), tableSays)}, tableNATS, nil
}
