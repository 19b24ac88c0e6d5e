package cutover_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
)

// The relayd phases condition fails naming each running relay that does not
// write to JetStream, or that runs apart from the table's phase once it is
// set; with no relay reporting it holds and says so.
func TestCheckRelaydPhases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	ns := testenv.NewStream(t, "cp")
	if _, err := ns.Stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "new-side", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second}); err != nil {
		t.Fatal(err)
	}
	cfg := cutover.Config{DB: pool, Table: table, JS: ns.JS, QuietPeriod: 100 * time.Millisecond, Poll: 50 * time.Millisecond,
		Groups: []cutover.Group{{Stream: ns.Name, Consumer: "new-side", Path: cutover.RollingUpgrade}}}

	type relay struct {
		name   string
		phase  phase.Name
		pinned bool
	}
	for _, tc := range []struct {
		name       string
		table      phase.Name // "": not set
		relays     []relay
		ok         bool
		wantDetail []string
	}{
		{"no relay reports", "", nil, true, []string{"no relay reports its phase"}},
		{"all dual, table not set", "", []relay{{"a:1", phase.Dual, false}, {"b:2", phase.Dual, true}}, true, []string{"2 relays report: 2 dual", "not set"}},
		{"one still amqp", "", []relay{{"a:1", phase.Dual, false}, {"b:2", phase.AMQP, true}}, false, []string{"b:2 runs amqp (pinned by RELAY_TARGETS): the rows it finishes skip JetStream"}},
		{"amqp while the table says dual", phase.Dual, []relay{{"a:1", phase.AMQP, true}}, false, []string{"a:1 runs amqp"}},
		{"pinned to nats while the table says dual", phase.Dual, []relay{{"a:1", phase.Dual, false}, {"b:2", phase.NATS, true}}, false, []string{"b:2 runs nats (pinned by RELAY_TARGETS) while the table says dual"}},
		{"all in the table's phase", phase.NATS, []relay{{"a:1", phase.NATS, false}, {"b:2", phase.NATS, true}}, true, []string{"2 relays report: 2 nats", "phase is nats"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, side := range []string{"instances", "phase"} {
				if _, err := pool.Exec(ctx, `DELETE FROM `+table.Side(side)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.table != "" {
				if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: tc.table, ChangedBy: "test", Forced: tc.table == phase.NATS}, phase.Change{}, false); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range tc.relays {
				if err := phase.Beat(ctx, pool, table, phase.Instance{Instance: r.name, Phase: r.phase, Pinned: r.pinned, Version: "test", StartedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			res, err := cutover.Check(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var c *cutover.Condition
			for i := range res.Conditions {
				if res.Conditions[i].Name == cutover.CondPhases {
					c = &res.Conditions[i]
				}
			}
			if c == nil {
				t.Fatalf("no %s condition: %+v", cutover.CondPhases, res.Conditions)
			}
			if c.OK != tc.ok || res.OK != tc.ok {
				t.Errorf("%s OK = %v (check OK = %v), want %v: %s", c.Name, c.OK, res.OK, tc.ok, c.Detail)
			}
			for _, want := range tc.wantDetail {
				if !strings.Contains(c.Detail, want) {
					t.Errorf("%s: %q, want it to say %q", c.Name, c.Detail, want)
				}
			}
			// A relay in the right phase is not named.
			for _, r := range tc.relays {
				if !tc.ok && r.phase == tc.table && strings.Contains(c.Detail, r.name+" runs") {
					t.Errorf("%s names %s, which runs the table's phase: %q", c.Name, r.name, c.Detail)
				}
			}
		})
	}
}
