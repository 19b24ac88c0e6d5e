// Package relay moves committed outbox rows to the brokers, so that a
// service can commit its data and a message in one transaction and still
// have the message reach every target: at least once (deduped by message
// id), in order per key.
//
// Workers claim batches of rows (SELECT ... FOR UPDATE SKIP LOCKED),
// publish each row to every enabled target that still needs it, and record
// per target what the broker confirmed, in one short transaction per batch.
// The row locks are the lease: a relay that dies releases them with its
// connection. Each target progresses on its own: a target whose broker is
// down is left out of claims while the other keeps flowing.
//
// It is relayd's engine, run by `relayd run`; it sits at the top level by the
// project's layout, not as a library for other programs: its API follows
// the binary's needs and may change with any release.
package relay

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Observer is told what the relay does; the metrics package implements it.
// Methods are called from several goroutines.
type Observer interface {
	Batch(d time.Duration, rows int)
	Published(t Target, createdAt time.Time)
	PublishFailed(t Target, err error)
	Parked(t Target)
	// LateConfirmed: n confirms of t that came after their batch gave up
	// waiting were recorded as deliveries.
	LateConfirmed(t Target, n int)
	// Phase: the phase the relay runs and the table's, after each read of
	// the table's (Config.Phase).
	Phase(s PhaseState)
}

type nopObserver struct{}

func (nopObserver) Batch(time.Duration, int)    {}
func (nopObserver) Published(Target, time.Time) {}
func (nopObserver) PublishFailed(Target, error) {}
func (nopObserver) Parked(Target)               {}
func (nopObserver) LateConfirmed(Target, int)   {}
func (nopObserver) Phase(PhaseState)            {}

// Relay publishes an outbox table's rows. Create it with New, run it with Run.
type Relay struct {
	cfg        Config
	pool       *pgxpool.Pool
	store      *store
	sinks      perTarget[Sink]          // nil when the relay has no connection to the target
	phase      phaseState               // the targets new batches run for, and the table's phase
	retryBound perTarget[time.Duration] // caps the backoff of a row with an unknown outcome (RetryBounder); 0: none
	breaker    perTarget[*breaker]
	log        *slog.Logger

	wake  kick             // rows were committed (NOTIFY), or the listener reconnected
	drain kick             // a worker's batch came back full: there may be more
	back  *reconnected     // the listener connected again: stalled workers retry now
	idle  *idleState       // whether the relay waits for rows: the listener holds the wake lock then
	floor *claimFloor      // where claims start; one claim at a time
	held  *heldRows        // keyed rows of batches in flight
	full  fullSince        // per target and topic, since when the broker refuses rows for room
	late  chan lateConfirm // confirms that came after their batch gave up, for recordLate
	sweep strandedSweep    // finishStranded's place
	// trimmed is, for the delivered and the backfilled record, the newest
	// row the cleanup deleted: its next pass starts there (CleanupOnce).
	trimmed [2]time.Time

	tracer *tracer // nil when tracing is off

	hooks *testHooks // nil in production
	// wakeRecheck is how often the listener reads the table's wake-up keys
	// again while it has no wake lock.
	wakeRecheck time.Duration
}

// wakeRecheckEvery is how soon a relay started before its table was
// migrated to the wake lock (migration 00007) takes it.
const wakeRecheckEvery = 10 * time.Second

// New returns a relay for pool's database. pool should connect directly to
// Postgres (LISTEN does not work through transaction pooling).
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, pool: pool, store: newStore(cfg.Table), log: cfg.Logger,
		wake: newKick(), drain: newKick(), back: newReconnected(), idle: newIdleState(),
		floor: newClaimFloor(cfg.BatchSize, cfg.PollInterval), held: newHeldRows(),
		late: make(chan lateConfirm, lateBuffer), sweep: strandedSweep{slice: sweepSliceRows},
		wakeRecheck: wakeRecheckEvery, tracer: newTracer(cfg.TracerProvider, cfg.Sinks, cfg.Table.String())}
	for _, s := range cfg.Sinks {
		t := s.Target()
		r.sinks.Set(t, s)
		r.breaker.Set(t, &breaker{})
		if rb, ok := s.(RetryBounder); ok {
			r.retryBound.Set(t, rb.RetryBound())
		}
		if lc, ok := s.(LateConfirmer); ok {
			lc.OnLateConfirm(r.onLateConfirm(t))
		}
	}
	r.phase.running, r.phase.read = phaseOf(cfg.Targets), make(chan struct{})
	if cfg.Phase == nil {
		close(r.phase.read)
	}
	return r, nil
}

// Run relays until ctx is cancelled, then stops claiming, lets in-flight
// batches finish (at most PublishTimeout plus a database round trip),
// records the confirms that came late, and returns nil. Failures while it
// runs are logged and retried, not returned.
func (r *Relay) Run(ctx context.Context) error {
	stopLate, lateDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(lateDone); r.recordLate(stopLate) }()
	var wg sync.WaitGroup
	if r.cfg.Phase != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.followPhase(ctx) }()
		select { // a Postgres that never answers must not keep Run from stopping
		case <-r.phase.read:
		case <-ctx.Done():
			wg.Wait()
			close(stopLate)
			<-lateDone
			return nil
		}
	}
	wg.Add(2 + r.cfg.Workers)
	go func() { defer wg.Done(); r.listen(ctx) }()
	go func() { defer wg.Done(); r.cleanup(ctx) }()
	for i := range r.cfg.Workers {
		go func() { defer wg.Done(); r.work(ctx, i) }()
	}
	r.log.Info("relay started", "table", r.cfg.Table.String(), "targets", r.targetNames(),
		"pinned", r.cfg.Pinned, "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "gomaxprocs", runtime.GOMAXPROCS(0))
	wg.Wait()
	close(stopLate) // the batches are done: what confirms came late, record now
	<-lateDone
	r.log.Info("relay stopped")
	return nil
}

func (r *Relay) targetNames() []string {
	var out []string
	for _, t := range r.phase.now().targets() {
		out = append(out, string(t))
	}
	return out
}
