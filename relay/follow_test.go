package relay

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

func TestTakePhase(t *testing.T) {
	amqp, nats, dual := []Target{TargetAMQP}, []Target{TargetNATS}, []Target{TargetAMQP, TargetNATS}
	for _, tc := range []struct {
		name    string
		sinks   []Target
		running []Target
		pinned  bool
		table   []Target
		switch_ bool
		warn    bool
		after   []Target
	}{
		{"no phase set: keep", dual, amqp, false, nil, false, false, amqp},
		{"the same: keep", dual, dual, false, dual, false, false, dual},
		{"follow to dual", dual, amqp, false, dual, true, false, dual},
		{"follow to nats", dual, dual, false, nats, true, false, nats},
		{"follow back", dual, nats, false, amqp, true, false, amqp},
		{"pinned: keep, warn", dual, amqp, true, dual, false, true, amqp},
		{"no sink for nats: keep, warn", amqp, amqp, false, dual, false, true, amqp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Relay{cfg: Config{Pinned: tc.pinned}}
			for _, s := range tc.sinks {
				r.sinks.Set(s, newFake(s))
			}
			r.phase.running = phaseOf(tc.running)
			switched, warn := r.takePhase(tc.table)
			if switched != tc.switch_ || (warn != "") != tc.warn {
				t.Fatalf("switched %v, warning %q; want %v, a warning %v", switched, warn, tc.switch_, tc.warn)
			}
			if got := r.Phase(); !slices.Equal(got.Running, tc.after) || !slices.Equal(got.Table, tc.table) {
				t.Errorf("state %+v, want running %v", got, tc.after)
			}
			if _, again := r.takePhase(tc.table); again != "" {
				t.Errorf("warned again for the same phase: %q", again)
			}
		})
	}
}

// setPhase is a PhaseSource a test sets.
type setPhase struct {
	mu      sync.Mutex
	targets []Target
}

func (s *setPhase) set(t ...Target) { s.mu.Lock(); s.targets = t; s.mu.Unlock() }

func (s *setPhase) Phase(context.Context) ([]Target, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.targets), s.targets != nil, nil
}

// phaseSeen tells the test each phase state the relay reports.
type phaseSeen struct {
	nopObserver
	states chan PhaseState
}

func (p phaseSeen) Phase(s PhaseState) {
	select {
	case p.states <- s:
	default:
	}
}

// waitRunning waits for the relay to report it runs want.
func (p phaseSeen) waitRunning(t *testing.T, want ...Target) PhaseState {
	t.Helper()
	return p.wait(t, want, false)
}

// waitOnly waits for the relay to run want and no batch of another phase:
// one begun before the switch claims under the phase it began in.
func (p phaseSeen) waitOnly(t *testing.T, want ...Target) PhaseState {
	t.Helper()
	return p.wait(t, want, true)
}

func (p phaseSeen) wait(t *testing.T, want []Target, only bool) PhaseState {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-p.states:
			if slices.Equal(s.Running, want) && (!only || s.Finishing == nil) {
				return s
			}
		case <-deadline:
			t.Fatalf("the relay never reported running %v", want)
		}
	}
}

// A relay that follows the table's phase sends each row to the targets of
// the phase it was claimed in, without a restart; a pinned one keeps its
// phase and reports the difference.
func TestRelayFollowsThePhase(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	src := &setPhase{}
	src.set(TargetAMQP)
	seen := phaseSeen{states: make(chan PhaseState, 16)}
	f.start(Config{Sinks: []Sink{a, n}, Phase: src, PhaseInterval: 20 * time.Millisecond, Metrics: seen})
	seen.waitRunning(t, TargetAMQP)

	for _, step := range []struct {
		phase      []Target
		amqp, nats bool
	}{
		{[]Target{TargetAMQP}, true, false},
		{[]Target{TargetAMQP, TargetNATS}, true, true},
		{[]Target{TargetNATS}, false, true},
		{[]Target{TargetAMQP}, true, false},
	} {
		src.set(step.phase...)
		seen.waitOnly(t, step.phase...)
		ids := f.insert(50, "orders.created")
		testenv.Eventually(t, 10*time.Second, func() bool {
			for _, id := range ids {
				if s := f.state(id); !s.done {
					return false
				}
			}
			return true
		}, "rows of phase %v not done", step.phase)
		for _, id := range ids {
			ga, _ := a.count(id)
			gn, _ := n.count(id)
			if (ga == 1) != step.amqp || (gn == 1) != step.nats || ga > 1 || gn > 1 {
				t.Fatalf("phase %v: row %s reached RabbitMQ %d and JetStream %d times", step.phase, id, ga, gn)
			}
		}
	}
}

func TestPinnedRelayKeepsItsPhase(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	src := &setPhase{}
	src.set(TargetAMQP, TargetNATS)
	seen := phaseSeen{states: make(chan PhaseState, 16)}
	f.start(Config{Sinks: []Sink{a, n}, Targets: []Target{TargetAMQP}, Pinned: true, Phase: src, PhaseInterval: 20 * time.Millisecond, Metrics: seen})
	if s := seen.waitRunning(t, TargetAMQP); !s.Mismatch() || !s.Pinned {
		t.Fatalf("pinned relay reported %+v, want a mismatch with the table's dual", s)
	}
	ids := f.insert(20, "orders.created")
	testenv.Eventually(t, 10*time.Second, func() bool { return a.total() == len(ids) && f.countDone() == len(ids) }, "pinned relay did not deliver to RabbitMQ")
	if n.total() != 0 {
		t.Fatalf("pinned to amqp, the relay published %d to JetStream", n.total())
	}
}

// A batch claimed in one phase records under it, whatever the phase is by
// its end: claimed for RabbitMQ only, its rows leave the outbox once
// RabbitMQ has them, as after a restart into dual write.
func TestBatchFinishesUnderItsPhase(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	src := &setPhase{}
	src.set(TargetAMQP)
	seen := phaseSeen{states: make(chan PhaseState, 16)}
	var once sync.Once
	f.startWith(Config{Sinks: []Sink{a, n}, Phase: src, PhaseInterval: 20 * time.Millisecond, Metrics: seen, Workers: 1},
		func(r *Relay) {
			r.hooks = &testHooks{afterPublish: func() {
				once.Do(func() {
					src.set(TargetAMQP, TargetNATS)
					seen.waitRunning(t, TargetAMQP, TargetNATS)
				})
			}}
		})
	seen.waitRunning(t, TargetAMQP)
	ids := f.insert(10, "orders.created")
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(ids) }, "rows not done")
	for _, id := range ids {
		if s := f.state(id); !s.amqpDelivered || s.natsDelivered {
			t.Fatalf("row %s: %+v, want delivered to RabbitMQ only, under the phase its batch was claimed in", id, s)
		}
	}
	if n.total() != 0 {
		t.Fatalf("JetStream got %d rows of a batch claimed in phase amqp", n.total())
	}
	later := f.insert(10, "orders.created")
	testenv.Eventually(t, 10*time.Second, func() bool { return n.total() == len(later) }, "rows committed in dual write did not reach JetStream")
}

// failingPhase fails every read until fails reads have failed, then
// answers targets.
type failingPhase struct {
	mu      sync.Mutex
	fails   int
	calls   int
	targets []Target
}

func (s *failingPhase) failing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls <= s.fails
}

func (s *failingPhase) Phase(context.Context) ([]Target, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.calls <= s.fails {
		return nil, false, errors.New("postgres: connection refused")
	}
	return slices.Clone(s.targets), true, nil
}

// A relay that follows the table and cannot read its phase at start claims
// nothing until it can: its start phase (both targets) is not the table's
// (amqp here), and a rolling upgrade must not see a row on both brokers.
func TestRelayWaitsForTheTablesPhase(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.insert(20, "orders.created")
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	src := &failingPhase{fails: 5, targets: []Target{TargetAMQP}}
	var early atomic.Bool
	r, _, _ := f.startWith(Config{Sinks: []Sink{a, n}, Phase: src, PhaseInterval: 20 * time.Millisecond},
		func(r *Relay) {
			r.hooks = &testHooks{claiming: func() {
				if src.failing() {
					early.Store(true)
				}
			}}
		})
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(ids) }, "rows not done")
	if early.Load() {
		t.Error("the relay claimed before it had read the table's phase")
	}
	if n.total() != 0 {
		t.Errorf("JetStream got %d rows while the table's phase is amqp", n.total())
	}
	if u := r.Unready(); len(u) != 0 {
		t.Errorf("Unready after the phase was read: %q", u)
	}
}

// While the phase cannot be read, /readyz says so, and Run still stops.
func TestRelayThatCannotReadThePhaseStops(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src := &failingPhase{fails: 1 << 30}
	r, cancel, done := f.start(Config{Sinks: []Sink{newFake(TargetAMQP), newFake(TargetNATS)}, Phase: src, PhaseInterval: 20 * time.Millisecond})
	testenv.Eventually(t, 10*time.Second, func() bool { src.mu.Lock(); defer src.mu.Unlock(); return src.calls > 1 }, "the phase was not read again")
	if u := r.Unready(); len(u) == 0 || !strings.Contains(u[0], "phase") {
		t.Errorf("Unready while the phase cannot be read: %q, want it said", u)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

// Batches begun before a switch keep the relay's reported phase at theirs
// until they end; of two earlier phases, nats only first.
func TestFinishingPhase(t *testing.T) {
	amqp, nats, dual := []Target{TargetAMQP}, []Target{TargetNATS}, []Target{TargetAMQP, TargetNATS}
	r := &Relay{}
	for _, s := range Targets {
		r.sinks.Set(s, newFake(s))
	}
	r.phase.running = phaseOf(amqp)
	inAMQP := r.phase.begin()
	r.takePhase(nats)
	inNATS := r.phase.begin()
	r.takePhase(dual)
	inDual := r.phase.begin()
	for _, step := range []struct {
		end  *phase
		want []Target
	}{
		{nil, nats},
		{&inNATS, amqp},
		{&inAMQP, nil},
		{&inDual, nil},
	} {
		if step.end != nil {
			r.phase.end(*step.end)
		}
		if s := r.Phase(); !slices.Equal(s.Finishing, step.want) || !slices.Equal(s.Running, dual) {
			t.Fatalf("after ending %v: %+v, want running dual, finishing %v", step.end, s, step.want)
		}
	}
}
