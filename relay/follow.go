package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/relayd/relayd/internal/errlog"
)

// PhaseSource is the outbox's shared phase, which an operator sets once for
// every relay (package phase keeps it in Postgres). Phase returns the
// targets it requires; set is false while no phase was ever set. It is
// called from one goroutine, every Config.PhaseInterval.
type PhaseSource interface {
	Phase(ctx context.Context) (targets []Target, set bool, err error)
}

// PhaseState is the phase a relay runs, and the table's.
type PhaseState struct {
	Running []Target // the targets new batches publish to and must reach
	Table   []Target // the table's phase; nil while none is set or it was not read yet
	Pinned  bool     // Config.Pinned: the relay keeps Running whatever the table says
	// Finishing is an earlier phase that batches begun before the relay's
	// last switch still run (nil when none): the relay's report says it
	// until they end, so the backfill, the replay and the cutover check,
	// which read the reports, wait for them too.
	Finishing []Target
}

// Mismatch reports whether the relay runs a phase other than the table's.
func (s PhaseState) Mismatch() bool { return s.Table != nil && !slices.Equal(s.Running, s.Table) }

// phaseState is the relay's current phase and the table's, as last read.
// followPhase writes it; each batch reads the phase once, at its start, and
// finishes under it. mu guards the fields after it.
type phaseState struct {
	// followPhase closes read once it has read the table's phase (pinned:
	// tried to), New at once without Config.Phase; Run starts workers then.
	read    chan struct{}
	mu      sync.Mutex
	running phase         // takePhase switches it; batches, the cleanup and Phase read it
	table   []Target      // takePhase writes the table's phase as read; nil before
	warned  []Target      // the table's phase takePhase last warned about, so it warns once per phase
	batches map[phase]int // runBatch counts itself in, by the phase it runs, until it ends
}

// now returns the phase new batches run in.
func (p *phaseState) now() phase {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running
}

// begin returns the phase a new batch runs in and counts the batch in it
// until end.
func (p *phaseState) begin() phase {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.batches == nil {
		p.batches = map[phase]int{}
	}
	p.batches[p.running]++
	return p.running
}

func (p *phaseState) end(ph phase) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.batches[ph]--; p.batches[ph] <= 0 {
		delete(p.batches, ph)
	}
}

// finishing is an earlier phase batches still run. Of two (a second switch
// within a batch's life) it takes nats only, then amqp only: the phases the
// replay and the backfill wait out. Under p.mu.
func (p *phaseState) finishing() []Target {
	var pick *phase
	rank := func(ph phase) int {
		switch {
		case ph.NATSOnly():
			return 0
		case !ph.NATS:
			return 1
		}
		return 2
	}
	for ph := range p.batches {
		if ph != p.running && (pick == nil || rank(ph) < rank(*pick)) {
			pick = &ph
		}
	}
	if pick == nil {
		return nil
	}
	return pick.targets()
}

// Phase returns the phase the relay runs and the table's. Safe for
// concurrent use (/readyz and the instance report use it).
func (r *Relay) Phase() PhaseState {
	r.phase.mu.Lock()
	defer r.phase.mu.Unlock()
	return PhaseState{Running: r.phase.running.targets(), Table: slices.Clone(r.phase.table), Pinned: r.cfg.Pinned,
		Finishing: r.phase.finishing()}
}

// PhaseRead is closed once the relay has read the table's phase (pinned:
// tried to; at once without Config.Phase): from then on Phase says what its
// batches run.
func (r *Relay) PhaseRead() <-chan struct{} { return r.phase.read }

// followPhase reads the table's phase every PhaseInterval until ctx is
// done; first a read at once, so the first batches run in the table's phase.
func (r *Relay) followPhase(ctx context.Context) {
	errs := errlog.New(r.log, "read the table's phase from Postgres")
	t := time.NewTicker(r.cfg.PhaseInterval)
	defer t.Stop()
	waiting, said := true, false
	for {
		// A relay that follows claims nothing before it knows the table's
		// phase: the phase it starts in (both targets) need not be the table's.
		ok := r.readPhase(ctx, errs)
		switch {
		case waiting && (ok || r.cfg.Pinned):
			close(r.phase.read)
			waiting = false
		case waiting && !said && ctx.Err() == nil:
			r.log.Warn("not claiming until the table's phase is read from Postgres", "phase_table", r.cfg.Table.Side("phase"))
			said = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readPhase reads the table's phase and, unless pinned, switches to it; it
// reports whether the read answered. On an error the relay keeps its phase.
func (r *Relay) readPhase(ctx context.Context, errs *errlog.Limiter) bool {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseInterval+5*time.Second)
	targets, set, err := r.cfg.Phase.Phase(rctx)
	cancel()
	if err != nil {
		errs.Error(fmt.Errorf("%w (the relay keeps phase %v)", err, r.Phase().Running))
		return false
	}
	errs.OK()
	if !set {
		targets = nil
	}
	switched, warn := r.takePhase(targets)
	s := r.Phase()
	if switched {
		r.log.Info("phase changed: following the table's", "phase", s.Running)
		r.wake.signal() // idle workers claim under the new phase at once
	}
	if warn != "" {
		r.log.Error(warn, "running", s.Running, "table", s.Table)
	}
	r.cfg.Metrics.Phase(s)
	return true
}

// takePhase records the table's phase and switches new batches to it
// unless pinned or a sink is missing; warn says why it did not switch, once
// per phase of the table.
func (r *Relay) takePhase(table []Target) (switched bool, warn string) {
	p := &r.phase
	p.mu.Lock()
	defer p.mu.Unlock()
	p.table = table
	want := phaseOf(table)
	if table == nil || want == p.running {
		p.warned = nil
		return false, ""
	}
	missing := r.missingSinks(want)
	if !r.cfg.Pinned && len(missing) == 0 {
		p.running, p.warned = want, nil
		return true, ""
	}
	if slices.Equal(p.warned, table) {
		return false, ""
	}
	p.warned = table
	if r.cfg.Pinned {
		return false, "RELAY_TARGETS pins this relay to a phase other than the table's: it does not follow `relayd phase set`"
	}
	return false, fmt.Sprintf("cannot follow the table's phase: no connection to %v is configured", missing)
}

// missingSinks lists the targets of p the relay has no sink for.
func (r *Relay) missingSinks(p phase) []Target {
	var out []Target
	for _, t := range p.targets() {
		if r.sinks.Get(t) == nil {
			out = append(out, t)
		}
	}
	return out
}

// phaseOf is the set of targets.
func phaseOf(targets []Target) phase {
	var p phase
	for _, t := range targets {
		p.Set(t, true)
	}
	return p
}
