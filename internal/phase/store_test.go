package phase_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
)

// Set records a change in the phase and its history, only from the phase
// it was checked against; Read and History read them back.
func TestSetReadHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)

	if _, ok, err := phase.Read(ctx, pool, table); err != nil || ok {
		t.Fatalf("a new table: Read ok=%v, %v; want not set", ok, err)
	}
	at1, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.Dual, ChangedBy: "alice@h", Reason: "start dual write"}, phase.Change{}, false)
	if err != nil {
		t.Fatal(err)
	}
	c, ok, err := phase.Read(ctx, pool, table)
	if err != nil || !ok || c.Phase != phase.Dual || c.ChangedBy != "alice@h" || c.Reason != "start dual write" || !c.ChangedAt.Equal(at1) {
		t.Fatalf("Read: %+v ok=%v %v; want dual by alice@h at %v", c, ok, err, at1)
	}

	// Compare-and-set: from a phase that is not the table's, or "not set"
	// once one is, nothing is recorded.
	for _, tc := range []struct {
		from    phase.Name
		fromSet bool
	}{{"", false}, {phase.AMQP, true}, {phase.NATS, true}} {
		_, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.NATS, ChangedBy: "bob@h", Forced: true}, phase.Change{Phase: tc.from}, tc.fromSet)
		if !errors.Is(err, phase.ErrChanged) {
			t.Errorf("Set from %q (set %v) while dual: %v, want ErrChanged", tc.from, tc.fromSet, err)
		}
	}
	at2, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.NATS, ChangedBy: "bob@h", Reason: "cutover", Forced: true}, c, true)
	if err != nil {
		t.Fatal(err)
	}
	if c, _, _ := phase.Read(ctx, pool, table); c.Phase != phase.NATS || c.Reason != "cutover" {
		t.Errorf("Read after the second Set: %+v", c)
	}
	h, err := phase.History(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	want := []phase.Change{
		{Phase: phase.Dual, ChangedAt: at1, ChangedBy: "alice@h", Reason: "start dual write"},
		{Phase: phase.NATS, ChangedAt: at2, ChangedBy: "bob@h", Reason: "cutover", Forced: true},
	}
	if !slices.EqualFunc(h, want, func(a, b phase.Change) bool {
		return a.Phase == b.Phase && a.ChangedAt.Equal(b.ChangedAt) && a.ChangedBy == b.ChangedBy && a.Reason == b.Reason && a.Forced == b.Forced
	}) {
		t.Errorf("History:\n%+v\nwant\n%+v", h, want)
	}
}

// Set from a reading of the phase fails once the phase was changed and
// set back meanwhile (dual, amqp, dual): the relays ran amqp after the
// caller's check, so its move must not be recorded.
func TestSetFailsOnThePhaseSetAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	set := func(to phase.Name) {
		t.Helper()
		from, ok, err := phase.Read(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: to, ChangedBy: "other@h"}, from, ok); err != nil {
			t.Fatal(err)
		}
	}
	set(phase.Dual)
	checked, _, err := phase.Read(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	set(phase.AMQP)
	set(phase.Dual)
	_, err = phase.Set(ctx, pool, table, phase.Change{Phase: phase.NATS, ChangedBy: "alice@h", Forced: true}, checked, true)
	if !errors.Is(err, phase.ErrChanged) {
		t.Fatalf("Set nats from the dual read before dual, amqp, dual: %v, want ErrChanged", err)
	}
	if now, _, _ := phase.Read(ctx, pool, table); now.Phase != phase.Dual {
		t.Errorf("phase %s after the refused Set, want dual", now.Phase)
	}
}

func TestLastPeriod(t *testing.T) {
	at := func(m int) time.Time { return time.Date(2026, 12, 1, 10, m, 0, 0, time.UTC) }
	ch := func(n phase.Name, m int) phase.Change { return phase.Change{Phase: n, ChangedAt: at(m)} }
	for _, tc := range []struct {
		name    string
		history []phase.Change
		want    phase.Period
		ok      bool
	}{
		{"empty", nil, phase.Period{}, false},
		{"never nats", []phase.Change{ch(phase.AMQP, 0), ch(phase.Dual, 1)}, phase.Period{}, false},
		{"nats now", []phase.Change{ch(phase.Dual, 0), ch(phase.NATS, 5)}, phase.Period{Phase: phase.NATS, Start: at(5)}, true},
		{"nats, then back", []phase.Change{ch(phase.Dual, 0), ch(phase.NATS, 5), ch(phase.Dual, 9)}, phase.Period{Phase: phase.NATS, Start: at(5), End: at(9)}, true},
		{"the latest of two", []phase.Change{ch(phase.NATS, 1), ch(phase.Dual, 2), ch(phase.NATS, 5), ch(phase.AMQP, 7), ch(phase.Dual, 8)}, phase.Period{Phase: phase.NATS, Start: at(5), End: at(7)}, true},
		{"set twice in a row: from the first", []phase.Change{ch(phase.Dual, 0), ch(phase.NATS, 3), ch(phase.NATS, 4), ch(phase.Dual, 6)}, phase.Period{Phase: phase.NATS, Start: at(3), End: at(6)}, true},
		{"the first change", []phase.Change{ch(phase.NATS, 0), ch(phase.Dual, 2)}, phase.Period{Phase: phase.NATS, Start: at(0), End: at(2)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := phase.LastPeriod(tc.history, phase.NATS)
			if ok != tc.ok || got != tc.want {
				t.Errorf("LastPeriod = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// Running lists the relays that reported lately, not those silent for
// longer than Seen; Astray picks those not in a phase.
func TestRunningAstray(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	started := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	for _, in := range []phase.Instance{
		{Instance: "b:2", Phase: phase.AMQP, Pinned: true, Version: "v1", StartedAt: started},
		{Instance: "a:1", Phase: phase.Dual, Version: "v2", StartedAt: started},
		{Instance: "c:3", Phase: phase.Dual, Version: "v2", StartedAt: started},
	} {
		if err := phase.Beat(ctx, pool, table, in); err != nil {
			t.Fatal(err)
		}
	}
	// c:3 last reported a minute ago: stopped without leaving.
	if _, err := pool.Exec(ctx, `UPDATE `+table.Side("instances")+` SET seen_at = now() - interval '1 minute' WHERE instance = 'c:3'`); err != nil {
		t.Fatal(err)
	}
	running, err := phase.Running(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range running {
		names = append(names, in.Instance)
		if in.Age < 0 || in.Age > phase.Seen || !in.StartedAt.Equal(started) {
			t.Errorf("%s: age %v, started %v; want within %v, started %v", in.Instance, in.Age, in.StartedAt, phase.Seen, started)
		}
	}
	if !slices.Equal(names, []string{"a:1", "b:2"}) {
		t.Fatalf("Running: %v, want [a:1 b:2] (c:3 silent for a minute)", names)
	}
	if b := running[1]; b.Phase != phase.AMQP || !b.Pinned || b.Version != "v1" {
		t.Errorf("b:2: %+v", b)
	}
	astray := phase.Astray(running, phase.Dual)
	if len(astray) != 1 || astray[0].Instance != "b:2" {
		t.Errorf("Astray from dual: %+v, want b:2", astray)
	}
	if err := phase.Leave(ctx, pool, table, "a:1"); err != nil {
		t.Fatal(err)
	}
	if running, _ := phase.Running(ctx, pool, table); len(running) != 1 || running[0].Instance != "b:2" {
		t.Errorf("after a:1 left: %+v", running)
	}
}

// Prune forgets the relays silent for ForgetAfter, killed ones; Beat does
// not, so that a relay's beats do not read the whole table, every version
// of every report a held horizon keeps.
func TestPruneForgetsSilentRelays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	silent := map[string]time.Duration{"a:1": 0, "b:2": phase.ForgetAfter - time.Hour, "c:3": phase.ForgetAfter + time.Minute}
	for name, ago := range silent {
		if err := phase.Beat(ctx, pool, table, phase.Instance{Instance: name, Phase: phase.Dual, Version: "v", StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE `+table.Side("instances")+` SET seen_at = now() - $2 * interval '1 millisecond' WHERE instance = $1`,
			name, ago.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	reports := func() []string {
		t.Helper()
		var names []string
		if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(instance ORDER BY instance), '{}') FROM `+table.Side("instances")).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return names
	}
	for _, step := range []struct {
		what string
		do   func() error
		want []string
	}{
		{"a beat", func() error {
			return phase.Beat(ctx, pool, table, phase.Instance{Instance: "a:1", Phase: phase.Dual, Version: "v", StartedAt: time.Now()})
		}, []string{"a:1", "b:2", "c:3"}},
		{"a prune", func() error { return phase.Prune(ctx, pool, table) }, []string{"a:1", "b:2"}},
	} {
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		if got := reports(); !slices.Equal(got, step.want) {
			t.Errorf("after %s: reports %v, want %v", step.what, got, step.want)
		}
	}
}
