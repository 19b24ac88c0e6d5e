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
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayd/relayd/schema"
)

// Observer is told what the relay does; the metrics package implements it.
// Methods are called from several goroutines.
type Observer interface {
	Batch(d time.Duration, rows int)
	Published(t Target, createdAt time.Time)
	PublishFailed(t Target, err error)
	Parked(t Target)
	// LateConfirmed reports that the relay recorded as deliveries n confirms
	// from t that came after their batch had stopped waiting.
	LateConfirmed(t Target, n int)
	// Phase reports the phase the relay runs and the table's phase; the
	// relay calls it each time it has read the table's phase (Config.Phase).
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
	phase      phaseState               // followPhase writes the phase; each batch reads it once, at its start
	retryBound perTarget[time.Duration] // caps the backoff of a row with an unknown outcome (RetryBounder); 0: none
	breaker    perTarget[*breaker]      // workers feed it each batch's results and skip a target it pauses
	log        *slog.Logger

	// The listener signals wake on a NOTIFY, a reconnection or rows its
	// wake-lock reads saw; followPhase and sweeping batches signal it too.
	// One idle worker takes each signal.
	wake wakeSignal
	// A worker whose batch came back at least half full signals drain: an
	// idle worker whose last claim found rows claims at once.
	drain wakeSignal
	// The listener signals reconnected each time it connects to Postgres;
	// every stalled worker then ends its backoff and retries.
	reconnected *reconnectSignal
	// Workers write their state into idle; the listener reads it to take or
	// release the wake lock (docs/design.md, "Waking the relay").
	idle  *idleState
	floor *claimFloor // workers read and advance it around each claim, under its lock
	// A worker adds its batch's keyed rows to held when it claims them and
	// removes them when the batch's transaction ends; claims skip them.
	held *heldRows
	// Workers record in outOfRoomSince, per target and topic, since when the
	// broker refuses rows for want of room; roomBackoff grows with it.
	outOfRoomSince roomRefusals
	// Sinks send on lateConfirms each confirm that came after its batch
	// gave up; the recordLate goroutine records them as deliveries.
	lateConfirms chan lateConfirm
	// stranded is the outbox id where finishStranded's next slice starts;
	// CleanupOnce reads and moves it.
	stranded strandedCursor
	// trimmed is, for the delivered and the backfilled record, the newest
	// row CleanupOnce deleted: its next pass starts there.
	trimmed [2]time.Time

	tracer *tracer // nil when tracing is off

	hooks *testHooks // nil in production
}

// New returns a relay for pool's database. pool should connect directly to
// Postgres (LISTEN does not work through transaction pooling).
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, pool: pool, store: newStore(cfg.Table), log: cfg.Logger,
		wake: newWakeSignal(), drain: newWakeSignal(), reconnected: newReconnectSignal(), idle: newIdleState(),
		floor: newClaimFloor(cfg.BatchSize, cfg.PollInterval), held: newHeldRows(),
		lateConfirms: make(chan lateConfirm, lateBuffer), stranded: strandedCursor{slice: strandedSliceRows},
		tracer: newTracer(cfg.TracerProvider, cfg.Sinks, cfg.Table.String())}
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
// runs are logged and retried, not returned. It first checks, once, that
// the table is migrated to schema.Minimum, and returns that check's error
// (a *schema.OutdatedError for an older table) without relaying.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.requireSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
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

// requireSchema is schema.Require for the relay's table: the relay has no
// code for a table older than schema.Minimum.
func (r *Relay) requireSchema(ctx context.Context) error {
	db := stdlib.OpenDBFromPool(r.pool)
	defer db.Close()
	return schema.Require(ctx, db, r.cfg.Table)
}

func (r *Relay) targetNames() []string {
	var out []string
	for _, t := range r.phase.now().targets() {
		out = append(out, string(t))
	}
	return out
}
