package main

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// fakePhase is a relay's phase as the report reads it.
type fakePhase struct {
	mu   sync.Mutex
	s    relay.PhaseState
	read chan struct{}
}

func (f *fakePhase) PhaseRead() <-chan struct{} { return f.read }

func (f *fakePhase) Phase() relay.PhaseState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakePhase) set(s relay.PhaseState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s = s
}

// The report rewrites its row only when its phase changes: a held horizon
// would keep every version, and each read of the row would step over them.
// Its session ended from outside (a restart, a failover), it reports again
// on a new one; as it stops, its row goes.
func TestReportWritesItsRowWhenItsPhaseChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	src := &fakePhase{s: relay.PhaseState{Running: []relay.Target{relay.TargetAMQP, relay.TargetNATS}}, read: make(chan struct{})}
	close(src.read)
	beats := make(chan struct{}, 1)
	rp := instanceReport{pool: pool, table: table, src: src, every: 5 * time.Millisecond, log: slog.New(slog.DiscardHandler),
		beat: func() {
			select {
			case beats <- struct{}{}:
			default:
			}
		}}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); rp.run(rctx) }()
	defer func() { stop(); <-done }()
	awaitBeats := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-beats:
			case <-time.After(30 * time.Second):
				t.Fatal("the report stopped beating")
			}
		}
	}
	// row is the report's row: its phase, its session, and its version.
	type row struct {
		phase   phase.Name
		pid     int32
		version string
	}
	read := func() (r row, ok bool) {
		t.Helper()
		running, err := phase.Running(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		if len(running) != 1 {
			return r, false
		}
		r.phase = running[0].Phase
		if err := pool.QueryRow(ctx, `SELECT pid, xmin::text || ctid::text FROM `+table.Side("instances")).Scan(&r.pid, &r.version); err != nil {
			t.Fatal(err)
		}
		return r, true
	}
	awaitBeats(2)
	first, ok := read()
	if !ok || first.phase != phase.Dual {
		t.Fatalf("after its first beats the relay is listed as %+v (%v), want phase dual", first, ok)
	}
	awaitBeats(50)
	if r, _ := read(); r != first {
		t.Errorf("50 beats in one phase rewrote the row: %+v, then %+v", first, r)
	}

	src.set(relay.PhaseState{Running: []relay.Target{relay.TargetNATS}})
	awaitBeats(2)
	if r, _ := read(); r.phase != phase.NATS || r.pid != first.pid {
		t.Errorf("after a switch to nats: %+v, want phase nats on session %d", r, first.pid)
	}

	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, first.pid); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		r, ok := read()
		return ok && r.pid != first.pid && r.phase == phase.NATS
	}, "the relay was not listed again on a new session after its session ended")

	stop()
	<-done
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table.Side("instances")).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows once the report stopped (%v), want its row gone", n, err)
	}
}
