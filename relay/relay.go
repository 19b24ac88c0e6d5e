// Package relay moves committed outbox rows to the brokers.
//
// Workers claim batches of rows with SELECT ... FOR UPDATE SKIP LOCKED,
// publish each row to every enabled target that still needs it, and record
// per target what the broker confirmed — all inside one short transaction per
// batch. The row locks are the lease: they are held only while the batch's
// publishes are in flight (bounded by Config.PublishTimeout, and by a
// server-side idle_in_transaction_session_timeout the caller should set), and
// a relay that dies releases them with its connection, so a peer takes the
// rows over at once. Several workers per process and several processes share
// one table; each batch waits only for its own confirms, so hundreds to
// thousands of confirms are in flight per target.
//
// Each target progresses on its own: a target whose broker is down is left
// out of claims (its rows wait, tracked by its own columns and index) while
// the other keeps flowing.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/schema"
)

// Config configures a Relay. Zero values take the defaults stated.
type Config struct {
	// Table is the outbox table. Default "outbox".
	Table schema.Table
	// Sinks are the enabled targets, at most one per Target. Required.
	Sinks []Sink
	// BatchSize is how many rows one worker claims at a time, 2 to 10,000
	// (at most half of them keyed). Default 500.
	BatchSize int
	// Workers is how many batches are in flight at once. Default 8.
	Workers int
	// PublishTimeout bounds how long a batch waits for confirms; messages
	// without one by then are retried. Default 10s.
	PublishTimeout time.Duration
	// PollInterval is how often an idle worker looks for rows when no
	// NOTIFY arrives. Default 1s.
	PollInterval time.Duration
	// RetryMin and RetryMax bound the per-row backoff after a failed
	// publish (exponential with jitter). Defaults 1s and 5m.
	RetryMin, RetryMax time.Duration
	// MaxAttempts parks a row for a target after this many failed
	// attempts (failures of the broker itself — disconnects, timeouts — do
	// not count). Negative means never. Default (0) 20: about an hour of
	// retries with the default backoff.
	MaxAttempts int
	// SkipParkedKeys lets the later rows of a key go past a parked row of
	// that key. Default false: a parked row holds its key (strict order)
	// until an operator retries it.
	SkipParkedKeys bool
	// Retention is how long the record of delivered message ids (which
	// reached each broker, and when) is kept; delivered rows themselves
	// leave the outbox at once. Default 24h.
	Retention time.Duration
	// CleanupInterval is how often delivered ids past Retention are
	// deleted, in batches of 1000, and — in the nats-only phase — the
	// next slice of the outbox is swept for rows JetStream has that
	// RabbitMQ owed before the move (see finishStranded). Default 1m.
	CleanupInterval time.Duration
	// Logger receives the relay's logs. Default: discard.
	Logger *slog.Logger
	// Metrics receives the relay's measurements. Default: none.
	Metrics Observer
}

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
}

type nopObserver struct{}

func (nopObserver) Batch(time.Duration, int)    {}
func (nopObserver) Published(Target, time.Time) {}
func (nopObserver) PublishFailed(Target, error) {}
func (nopObserver) Parked(Target)               {}
func (nopObserver) LateConfirmed(Target, int)   {}

func (c *Config) applyDefaults() {
	if c.Table == (schema.Table{}) {
		c.Table = schema.Table{Name: schema.DefaultTable}
	}
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	if c.Workers == 0 {
		c.Workers = 8
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 10 * time.Second
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.RetryMin == 0 {
		c.RetryMin = time.Second
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Minute
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 20
	}
	if c.CleanupInterval == 0 {
		c.CleanupInterval = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = nopObserver{}
	}
}

func (c *Config) validate() error {
	if _, err := schema.ParseTable(c.Table.String()); err != nil {
		return err
	}
	if len(c.Sinks) == 0 {
		return errors.New("relay: no sinks: at least one target must be enabled")
	}
	seen := map[Target]bool{}
	for _, s := range c.Sinks {
		if s == nil {
			return errors.New("relay: nil sink")
		}
		if seen[s.Target()] {
			return fmt.Errorf("relay: two sinks for target %s", s.Target())
		}
		if targetIndex(s.Target()) < 0 {
			return fmt.Errorf("relay: unknown target %q", s.Target())
		}
		seen[s.Target()] = true
	}
	switch {
	case c.BatchSize < 2 || c.BatchSize > 10000:
		// At least 2: a batch takes at most half (and at least 1) keyed
		// rows, and with 1 a keyed row would leave no room for unkeyed ones.
		return fmt.Errorf("relay: BatchSize %d out of range 2..10000", c.BatchSize)
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("relay: Workers %d out of range 1..256", c.Workers)
	case c.PublishTimeout < 0, c.PollInterval < 0, c.RetryMin < 0, c.Retention < 0, c.CleanupInterval < 0:
		return errors.New("relay: durations must not be negative")
	case c.RetryMax < c.RetryMin:
		return fmt.Errorf("relay: RetryMax %v below RetryMin %v", c.RetryMax, c.RetryMin)
	}
	return nil
}

func targetIndex(t Target) int {
	for i, x := range Targets {
		if x == t {
			return i
		}
	}
	return -1
}

// Relay publishes an outbox table's rows. Create it with New, run it with Run.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	store   *store
	sinks   [2]Sink // indexed like Targets; nil when disabled
	enabled [2]bool
	// The stranded-row sweep's place (see finishStranded): the next
	// slice starts past sweepFrom.
	sweepMu    sync.Mutex
	sweepFrom  int64
	sweepSlice int
	// retryBound caps the backoff of a row whose publish to the target had
	// an unknown outcome (RetryBounder); 0: none.
	retryBound [2]time.Duration
	breaker    [2]*breaker
	wake       kick       // rows were committed (NOTIFY), or the listener reconnected
	idle       *idleState // whether the relay waits for rows: the listener holds the wake lock then
	drain      kick       // a worker's batch came back full: there may be more
	log        *slog.Logger

	// full: per target and topic, since when the broker has refused its
	// rows for want of room, without storing one since (see roomBackoff).
	full fullSince

	// late carries confirms that came after their batch gave up waiting
	// (LateConfirmer) to recordLate.
	late chan lateConfirm

	// claimMu lets one claim of this relay run at a time (runBatch), and
	// guards the state that places the claims' unkeyed walks: highWater
	// and fullWalk (unix ns), see claimFloor; safe, seenXmin and tops, see
	// advanceFloor.
	claimMu   sync.Mutex
	highWater int64
	fullWalk  int64
	cheapWalk bool             // the last walk from the oldest row was short and quick
	safe      int64            // every row below it was taken (see advanceFloor)
	seenXmin  int64            // the newest claim snapshot's oldest running transaction
	tops      []floorCandidate // short claims' tops, waiting for seenXmin

	// heldMu guards held: the keyed rows this relay's batches in flight
	// hold, from their claim until their transaction ends. Claims do not
	// try to lock them (claimSQL).
	heldMu sync.Mutex
	held   map[int64]struct{}

	// testHookAfterPublish, when set, runs after a batch's publishes and
	// before its outcomes are recorded; testHookClaiming just before a
	// claim and testHookClaimed after it, with the number of rows it took
	// and the floor its walks started at. Nil in production.
	testHookAfterPublish func()
	testHookClaiming     func()
	testHookClaimed      func(rows int, floor int64)
	// testHookWakeLock runs just before the listener tries to take the
	// wake lock.
	testHookWakeLock func()
	// quickWalk is how often claims walk from the oldest row while that
	// walk is cheap, and cheapTook the longest such a walk may take (see
	// claimFloor); quickWalkEvery and cheapWalkTook unless a test says.
	quickWalk, cheapTook time.Duration
	// triggerRecheck is how often the listener reads the table's trigger
	// again while it has no wake lock; triggerRecheckEvery unless a test
	// says.
	triggerRecheck time.Duration
}

// triggerRecheckEvery is how soon a relay started before its table was
// migrated to the wake lock (migration 00007) takes it.
const triggerRecheckEvery = 10 * time.Second

// quickWalkEvery is how often, at most, claims walk from the oldest row
// while that walk is cheap; cheapWalkTook is what counts as cheap. A short
// claim takes a few milliseconds (p99 7 ms at 1,000 rows/s on the 2-core
// bench machine); with 5 ms as the bound, a slow walk now and then put the
// next one a PollInterval away, and the benchmark still saw 0.9 s; with
// 20 ms, at most 125 ms.
const (
	quickWalkEvery = 100 * time.Millisecond
	cheapWalkTook  = 20 * time.Millisecond
)

// New returns a relay for pool's database. pool should connect directly to
// Postgres (LISTEN does not work through transaction pooling).
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, pool: pool, store: newStore(cfg.Table), wake: newKick(), drain: newKick(), idle: newIdleState(), log: cfg.Logger,
		late: make(chan lateConfirm, lateBuffer), quickWalk: quickWalkEvery, cheapTook: cheapWalkTook, triggerRecheck: triggerRecheckEvery, held: map[int64]struct{}{},
		sweepSlice: sweepSliceRows}
	for _, s := range cfg.Sinks {
		i := targetIndex(s.Target())
		r.sinks[i], r.enabled[i] = s, true
		r.breaker[i] = &breaker{}
		if rb, ok := s.(RetryBounder); ok {
			r.retryBound[i] = rb.RetryBound()
		}
		if lc, ok := s.(LateConfirmer); ok {
			lc.OnLateConfirm(func(msgID string) {
				select {
				case r.late <- lateConfirm{ti: i, msgID: msgID}:
				default:
					// Full: this instance still knows (the sink does not
					// publish it again); only other instances may.
				}
			})
		}
	}
	return r, nil
}

// lateConfirm is a message a target confirmed after its batch gave up.
type lateConfirm struct {
	ti    int
	msgID string
}

// lateBuffer is how many late confirms wait to be recorded at most.
const lateBuffer = 1 << 14

// recordLate records late confirms as deliveries as they come, in sets of
// what has queued up: until then, only this instance knows the broker has
// the row, and another one retrying it would publish a second copy. A set
// that cannot be recorded is tried again, three times in all. After stop
// (the batches have finished), it records what is still queued and returns.
func (r *Relay) recordLate(stop <-chan struct{}) {
	for {
		var first lateConfirm
		stopping := false
		select {
		case <-stop:
			stopping = true
		case first = <-r.late:
		}
		byTarget := [2][]string{}
		if !stopping {
			byTarget[first.ti] = append(byTarget[first.ti], first.msgID)
		}
	more:
		for n := 1; n < 1000 || stopping; n++ {
			select {
			case c := <-r.late:
				byTarget[c.ti] = append(byTarget[c.ti], c.msgID)
			default:
				break more
			}
		}
		for ti, ids := range byTarget {
			if len(ids) > 0 {
				r.recordLateSet(ti, ids, stopping)
			}
		}
		if stopping {
			return
		}
	}
}

func (r *Relay) recordLateSet(ti int, ids []string, stopping bool) {
	for attempt := 1; ; attempt++ {
		// A row a batch in flight holds is locked for up to the batch's
		// publish timeout and its record: a fixed 30 s gave up on such
		// rows, the whole set with them, with RELAY_PUBLISH_TIMEOUT over
		// 30 s.
		lockWait := r.cfg.PublishTimeout + 30*time.Second
		limit := lockWait + 30*time.Second
		if stopping {
			limit = 5 * time.Second // the process is on its way out
		}
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		n, err := r.store.recordLate(ctx, r.pool, ti, ids, r.enabled, lockWait)
		cancel()
		if err == nil {
			r.cfg.Metrics.LateConfirmed(Targets[ti], len(ids))
			r.log.Info("late confirms recorded", "target", string(Targets[ti]), "confirms", len(ids), "rows_marked", n)
			return
		}
		if attempt == 3 || stopping {
			r.log.Warn("late confirms not recorded: another instance may publish these rows again",
				"target", string(Targets[ti]), "confirms", len(ids), "error", err.Error())
			return
		}
		time.Sleep(time.Second)
	}
}

// Run relays until ctx is cancelled, then stops claiming, lets in-flight
// batches finish (at most PublishTimeout plus a database round trip), and
// returns nil. It returns an error only if the relay cannot run at all.
func (r *Relay) Run(ctx context.Context) error {
	stopLate, lateDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(lateDone); r.recordLate(stopLate) }()
	var wg sync.WaitGroup
	wg.Add(2 + r.cfg.Workers)
	go func() { defer wg.Done(); r.listen(ctx) }()
	go func() { defer wg.Done(); r.cleanup(ctx) }()
	for i := range r.cfg.Workers {
		go func() { defer wg.Done(); r.work(ctx, i) }()
	}
	r.log.Info("relay started", "table", r.cfg.Table.String(), "targets", r.targetNames(),
		"workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "gomaxprocs", runtime.GOMAXPROCS(0))
	wg.Wait()
	close(stopLate) // the batches are done: what confirms came late, record now
	<-lateDone
	r.log.Info("relay stopped")
	return nil
}

func (r *Relay) targetNames() []string {
	var out []string
	for i, t := range Targets {
		if r.enabled[i] {
			out = append(out, string(t))
		}
	}
	return out
}

// work is one worker's loop: claim and publish batches back to back while
// they come back full, otherwise wait for a kick (a NOTIFY, or a worker
// that found a backlog) or the poll interval.
//
// A worker whose claim came back empty waits for a NOTIFY or the poll
// interval only, not for other workers' full batches: its claim just found
// that there is no work to spare. In a keyed backlog with few keys, every
// key's next row is in flight in some batch, and each full batch woke an
// idle worker into a claim that walked the keyed window to find nothing —
// one wasted claim per batch. The worker that finishes a batch claims the
// keys it freed itself.
func (r *Relay) work(ctx context.Context, id int) {
	log := r.log.With("worker", id)
	errs := errlog.New(log, "relay batch")
	w := r.idle.join()
	defer w.leave()
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		start := time.Now()
		n, keyed, err := r.runBatch(ctx, w)
		if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
			return // stopping: a claim cut short is not a failure to report
		}
		took := time.Since(start)
		switch {
		case err == nil:
			errs.OK()
			backoff = 0
		case errors.Is(err, errNoTarget):
			// Every enabled broker is down: wait for the first to come back.
			w.set(workerStalled)
			sleep(ctx, r.nextTargetCheck())
			w.set(workerFree)
			continue
		default:
			errs.Error(err)
			backoff = min(max(2*backoff, 100*time.Millisecond), 30*time.Second)
			w.set(workerStalled)
			sleep(ctx, jitter(backoff))
			w.set(workerFree)
			continue
		}
		if n >= max(1, r.cfg.BatchSize/2) {
			// Drain: there is probably more, for another worker too.
			// (Half: keyed rows come at most BatchSize/2 a batch, see
			// store.claim.)
			r.drain.signal()
			continue
		}
		if keyed > 0 {
			// The batch's keys are free again: their next rows, if any,
			// may go now, and no NOTIFY says so. Without this, a burst of
			// a few keys' rows moved one row per key per PollInterval.
			continue
		}
		if n == 0 && took > 5*time.Millisecond {
			// A claim that found nothing yet took long walked past rows it
			// may not take (keys held by earlier rows in flight elsewhere):
			// do not repeat that walk on every NOTIFY.
			sleep(ctx, 2*took)
		}
		drain := r.drain
		if n == 0 {
			drain = nil
		}
		t := time.NewTimer(r.cfg.PollInterval)
		w.set(workerFree)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-drain:
		case <-t.C:
		}
		t.Stop()
	}
}

var errNoTarget = errors.New("no target reachable")

// active reports which enabled targets may be published to now.
func (r *Relay) active(now time.Time) (act [2]bool, any bool) {
	for i := range Targets {
		if r.enabled[i] && r.sinks[i].Ready() == nil && r.breaker[i].allow(now) {
			act[i], any = true, true
		}
	}
	return act, any
}

// Unready says, for each enabled target that is not ready, why: its
// broker connection is down, or the relay paused it because every publish
// of its last batches failed for want of the broker (a blackholed or stalled
// broker whose connection still looks up). Empty means every target is
// ready. Safe for concurrent use; /readyz uses it.
func (r *Relay) Unready() []string {
	var out []string
	for i, t := range Targets {
		if !r.enabled[i] {
			continue
		}
		if err := r.sinks[i].Ready(); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", t, err))
			continue
		}
		if n, last := r.breaker[i].failing(time.Now(), r.cfg.PublishTimeout+r.cfg.PollInterval+time.Second); n > 0 {
			out = append(out, fmt.Sprintf("%s: paused after %d failed batch(es) in a row: %s", t, n, last))
		}
	}
	return out
}

// nextTargetCheck is how long to wait before looking at the targets again
// when none is active.
func (r *Relay) nextTargetCheck() time.Duration {
	d := r.cfg.PollInterval
	for i := range Targets {
		if r.enabled[i] {
			if w := r.breaker[i].wait(time.Now()); w > 0 && w < d {
				d = w
			}
		}
	}
	return min(d, 250*time.Millisecond)
}

// claimFloor is where this batch's unkeyed walks start: at the high-water
// mark (see advanceFloor), or — at least every PollInterval, and every
// quickWalk while the last such walk was cheap — from the oldest row.
//
// With a backlog, every worker's batch holds its rows locked until its
// confirms are in, and a claim walking from the oldest row has to step over
// every row the other workers hold (SKIP LOCKED skips each one only after
// trying its lock): with 4 workers, 3 batches' worth of rows per batch
// claimed. Starting past the high-water mark skips them without touching
// them. What it also skips — rows below it that became claimable meanwhile
// (a retry that fell due, rows another relay released) — the next walk from
// the oldest row takes, within PollInterval.
//
// One kind of row a floor cannot see coming: a row whose transaction took
// its id before a claim's snapshot but its transaction id after it (the
// identity default is evaluated before the insert assigns a transaction
// id), so that no snapshot shows it running; on a busy machine a producer
// can be descheduled in between. In the latency benchmark (1,000 rows/s)
// about one row in 2,000 was found only by the walk from the oldest row,
// up to PollInterval late: the run's largest latency, 0.86–1 s. So while
// that walk is cheap — it came back short and within cheapWalkTook: the
// rows it steps over are only the few in flight — it runs every quickWalk
// (100 ms), and such a row waits about that long. During a backlog, or
// with many rows waiting for a retry, it costs more and runs every
// PollInterval. Called with claimMu held.
func (r *Relay) claimFloor(now time.Time) int64 {
	every := int64(r.cfg.PollInterval)
	if r.cheapWalk {
		every = min(every, int64(r.quickWalk))
	}
	if now.UnixNano()-r.fullWalk >= every {
		r.fullWalk = now.UnixNano()
		return 0
	}
	return r.highWater
}

// floorCandidate is the top of a short claim that walked from the safe
// floor, and the claim snapshot's first unassigned transaction id.
type floorCandidate struct{ top, xmax int64 }

// maxFloorCandidates bounds the tops waiting for a transaction that runs
// long (elsewhere in the database); dropping one only delays the floor.
const maxFloorCandidates = 64

// advanceFloor places the next claims' unkeyed walks after a claim that
// started at floor.
//
// A full claim raises the high-water mark past its unkeyed rows: during a
// backlog the walks skip the rows the other batches hold (claimFloor). A
// full claim from the oldest row lowers it to its top instead: there are
// more claimable rows below the mark than a batch.
//
// A short claim walked to the end of what it may take. If it started at or
// below the safe floor, every row between the two that it did not take was
// held by another batch or is waiting for a retry, so its top row becomes the
// safe floor — once no transaction that was running at its snapshot still
// is: only such a transaction can still commit a row with a lower id (it
// took the id before the claim's snapshot, and the claim could not see the
// row). A later claim whose snapshot's oldest running transaction is past
// the candidate's snapshot's first unassigned id proves that; the claim
// after it starts at the new floor. Either way the high-water mark drops to
// the safe floor, so a short claim after a backlog walks from where every
// row is known taken, and at a steady moderate rate claims no longer walk
// over the rows that the batches in flight hold. What a floor can still
// miss — a retry that fell due, rows another relay released, a row whose
// transaction took its id but no transaction id before the snapshot — the
// walk from the oldest row every PollInterval takes. Called with claimMu
// held.
func (r *Relay) advanceFloor(rows []*claimed, floor int64, snap snapshot) {
	var top int64
	for _, c := range rows {
		if !c.msg.HasKey {
			top = max(top, c.msg.ID)
		}
	}
	r.seenXmin = max(r.seenXmin, snap.xmin)
	if len(rows) >= r.cfg.BatchSize && floor == 0 {
		// A full walk from the oldest row: what lies below the floor is
		// more than a batch — a target back from an outage (the floor
		// rose while only the other target's rows were walked), retries
		// falling due together. The next claims walk on from here; from
		// the high-water mark they would leave those rows to this walk,
		// a batch every PollInterval. At most the rows the batches in
		// flight hold are stepped over once more.
		r.highWater, r.safe, r.tops = top, min(r.safe, top), r.tops[:0]
		return
	}
	if len(rows) >= r.cfg.BatchSize {
		r.highWater = max(r.highWater, top)
		return
	}
	if top > 0 && floor <= r.safe && len(r.tops) < maxFloorCandidates {
		r.tops = append(r.tops, floorCandidate{top: top, xmax: snap.xmax})
	}
	waiting := r.tops[:0]
	for _, c := range r.tops {
		if c.xmax <= r.seenXmin {
			r.safe = max(r.safe, c.top)
		} else {
			waiting = append(waiting, c)
		}
	}
	r.tops = waiting
	r.highWater = r.safe
}

// runBatch claims, publishes and records one batch, returning the number of
// rows claimed and how many of them were keyed. The batch runs to completion
// even when ctx is cancelled (soft stop); only its own timeout bounds it.
//
// Two round trips to Postgres for a batch: begin and claim in one, record
// and commit in the other (pgx batches: the statements go out together and
// run in order, and an error skips the rest). A round trip costs both sides
// system calls and wake-ups, which at a few rows a batch are most of the
// relay's and Postgres's work.
func (r *Relay) runBatch(ctx context.Context, w *worker) (n, keyed int, err error) {
	start := time.Now()
	act, ok := r.active(start)
	if !ok {
		return 0, 0, errNoTarget
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout+30*time.Second)
	defer cancel()
	// Until it holds rows, a batch stops with the relay: a shutdown does
	// not wait for a connection, or a claim, from a Postgres that does not
	// answer. (A claim cut short rolls back; the rows stay owed.)
	cctx, ccancel := context.WithCancel(bctx)
	defer ccancel()
	defer context.AfterFunc(ctx, ccancel)()
	conn, err := r.pool.Acquire(cctx)
	if err != nil {
		return 0, 0, fmt.Errorf("begin: %w", err)
	}
	var held []int64 // the batch's keyed rows, in r.held until its transaction ends
	defer func() {
		// A transaction still open (or failed) here ends without a trace.
		// A connection that cannot roll back is closed on release, which
		// rolls back too.
		if conn.Conn().PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			conn.Exec(rctx, "ROLLBACK") //nolint:errcheck // see above
			cancel()
		}
		conn.Release()
		r.unhold(held)
	}()

	// One claim at a time: a claim starts where the one before it ended.
	// Claims that run together start at the same floor, and each walks
	// over, and tries to lock, the rows the others are taking — during a
	// backlog, more rows than it takes. A claim is a few milliseconds of a
	// batch that waits for the brokers for tens of milliseconds.
	r.claimMu.Lock()
	floor := r.claimFloor(time.Now())
	if r.testHookClaiming != nil {
		r.testHookClaiming()
	}
	claimStart := time.Now()
	rows, snap, err := r.store.claim(cctx, conn, act, r.cfg.BatchSize, r.cfg.SkipParkedKeys, floor, r.heldRows())
	if err == nil {
		if floor == 0 {
			r.cheapWalk = len(rows) < r.cfg.BatchSize && time.Since(claimStart) < r.cheapTook
		}
		r.advanceFloor(rows, floor, snap)
		held = r.hold(rows)
		if r.testHookClaimed != nil {
			r.testHookClaimed(len(rows), floor)
		}
	}
	r.claimMu.Unlock()
	if err != nil {
		return 0, 0, err
	}
	r.idle.claimed(rows)
	if len(rows) == 0 {
		if _, err := conn.Exec(cctx, "COMMIT"); err != nil { // holds nothing: stops with the relay too
			return 0, 0, fmt.Errorf("commit empty claim: %w", err)
		}
		return 0, 0, nil
	}

	w.set(workerBusy) // producers need not notify meanwhile
	rec := r.publish(bctx, rows)
	if r.testHookAfterPublish != nil {
		r.testHookAfterPublish()
	}
	if err := r.store.record(bctx, conn, rec); err != nil {
		return len(rows), len(held), err
	}
	r.cfg.Metrics.Batch(time.Since(start), len(rows))
	return len(rows), len(held), nil
}

// hold adds the keyed rows of a batch just claimed to r.held, and returns
// them. Called with claimMu held, so the next claim sees them.
func (r *Relay) hold(rows []*claimed) []int64 {
	var ids []int64
	for _, c := range rows {
		if c.msg.HasKey {
			ids = append(ids, c.msg.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	for _, id := range ids {
		r.held[id] = struct{}{}
	}
	return ids
}

// unhold removes a batch's keyed rows from r.held once its transaction has
// ended (committed or rolled back): other claims may lock them again.
func (r *Relay) unhold(ids []int64) {
	if len(ids) == 0 {
		return
	}
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	for _, id := range ids {
		delete(r.held, id)
	}
}

// heldRows lists r.held for a claim.
func (r *Relay) heldRows() []int64 {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	ids := make([]int64, 0, len(r.held))
	for id := range r.held {
		ids = append(ids, id)
	}
	return ids
}

// publish sends each row to the targets it wants, all targets at once, and
// returns the outcomes to record.
func (r *Relay) publish(ctx context.Context, rows []*claimed) *batchRecord {
	var results [2][]error
	var wg sync.WaitGroup
	for ti := range Targets {
		var msgs []*Message
		var idx []int
		for i, c := range rows {
			if c.want[ti] && c.badRow == "" {
				msgs = append(msgs, &c.msg)
				idx = append(idx, i)
			}
		}
		results[ti] = make([]error, len(rows))
		if len(msgs) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
			defer cancel()
			res := make([]error, len(msgs))
			r.sinks[ti].Publish(pctx, msgs, res)
			for j, i := range idx {
				results[ti][i] = res[j]
			}
		}()
	}
	wg.Wait()

	now := time.Now()
	rec := newBatchRecord(len(rows), r.enabled)
	for ti, t := range Targets {
		if !anyWanted(rows, ti) {
			continue
		}
		attempted, unavailable, delivered, full := 0, 0, 0, 0
		for i, c := range rows {
			if !c.want[ti] {
				continue
			}
			err := results[ti][i]
			if c.badRow == "" && errors.Is(err, ErrOutOfRoom) {
				full++ // the broker's room, not its reach: no say in pausing it
				continue
			}
			attempted++
			switch {
			case c.badRow != "":
			case err == nil:
				delivered++
			case errors.Is(err, ErrUnavailable):
				unavailable++
			}
		}
		// A target whose every publish in the batch failed for want of the
		// broker is left out of claims for a while (capped backoff), so the
		// other target is not held up by its timeouts batch after batch.
		if attempted > 0 && unavailable == attempted {
			if d := r.breaker[ti].failure(now, firstErr(results[ti])); d > 0 {
				r.log.Warn("target unavailable, pausing it", "target", string(t), "for", d.String(), "error", firstErr(results[ti]))
			}
		} else if delivered+full > 0 && r.breaker[ti].success() {
			// A refusal for room is an answer: the broker is reachable.
			r.log.Info("target recovered", "target", string(t))
		}
	}
	for i, c := range rows {
		var outcome [2]int16
		var errText [2]string
		var backoff [2]time.Duration
		for ti, t := range Targets {
			if !c.want[ti] {
				continue
			}
			err := results[ti][i]
			if c.badRow != "" {
				err = &PermanentError{Reason: c.badRow}
			}
			switch {
			case err == nil:
				outcome[ti] = outcomeDelivered
				r.full.stored(ti, c.msg.Topic)
				r.cfg.Metrics.Published(t, c.msg.CreatedAt)
			case IsPermanent(err):
				outcome[ti], errText[ti] = outcomeParked, err.Error()
				r.cfg.Metrics.Parked(t)
				r.log.Warn("row parked", "target", string(t), "id", c.msg.ID, "message_id", c.msg.MessageID, "reason", err.Error())
			case errors.Is(err, ErrOutOfRoom):
				// The broker's room, not the row: retry, without using up
				// attempts, later the longer its topic has been refused.
				outcome[ti], errText[ti] = outcomeOutage, err.Error()
				backoff[ti] = r.roomBackoff(now.Sub(r.full.refused(ti, c.msg.Topic, now, 2*r.cfg.RetryMax)))
				r.cfg.Metrics.PublishFailed(t, err)
			case errors.Is(err, ErrUnavailable):
				// The broker, not the row: retry, without using up attempts.
				outcome[ti], errText[ti] = outcomeOutage, err.Error()
				backoff[ti] = r.retryBackoff(c.attempts[ti] + 1)
				if b := r.retryBound[ti]; b > 0 {
					// It may have been stored: again within the
					// broker's dedupe window, whatever the row's
					// earlier failures made its backoff.
					backoff[ti] = min(backoff[ti], b)
				}
				if errors.Is(err, ErrAwaitingConfirm) {
					// Its confirm may still come: leave this instance
					// (recordLate) the time to record it before any
					// instance publishes the row again.
					backoff[ti] = max(backoff[ti], r.cfg.PublishTimeout)
				}
				r.cfg.Metrics.PublishFailed(t, err)
			case r.cfg.MaxAttempts > 0 && c.attempts[ti]+1 >= int32(r.cfg.MaxAttempts):
				outcome[ti] = outcomeParked
				errText[ti] = fmt.Sprintf("gave up after %d attempts: %v", c.attempts[ti]+1, err)
				r.cfg.Metrics.PublishFailed(t, err)
				r.cfg.Metrics.Parked(t)
				r.log.Warn("row parked", "target", string(t), "id", c.msg.ID, "message_id", c.msg.MessageID, "reason", errText[ti])
			default:
				outcome[ti], errText[ti] = outcomeRetry, err.Error()
				backoff[ti] = r.retryBackoff(c.attempts[ti] + 1)
				r.cfg.Metrics.PublishFailed(t, err)
			}
		}
		rec.add(c, outcome, errText, backoff)
	}
	return rec
}

func anyWanted(rows []*claimed, ti int) bool {
	for _, c := range rows {
		if c.want[ti] {
			return true
		}
	}
	return false
}

func firstErr(errs []error) string {
	for _, e := range errs {
		if e != nil {
			return e.Error()
		}
	}
	return ""
}

// retryBackoff is the wait before a row's next attempt on a target:
// RetryMin·2^(attempt-1), capped at RetryMax, jittered to 50–100%.
func (r *Relay) retryBackoff(attempt int32) time.Duration {
	d := r.cfg.RetryMax
	if attempt < 32 {
		if e := r.cfg.RetryMin << (attempt - 1); e > 0 && e < d {
			d = e
		}
	}
	return jitter(d)
}

// roomBackoff is the wait before a row the broker refused for want of room
// (ErrOutOfRoom) is published again, its topic refused for `refused`: half
// that, between RetryMin and RetryMax, jittered to 50–100%. Such refusals
// do not count as attempts, so the wait grows with the refusal instead
// (by a quarter to a half each retry: from RetryMin = 1 s to RetryMax = 5 min
// in about twenty), then every RetryMax —
// not every RetryMin for as long as the stream stays full, nor, for a row
// that waited long already (a backlog), RetryMax at the first refusal.
func (r *Relay) roomBackoff(refused time.Duration) time.Duration {
	return jitter(min(max(refused/2, r.cfg.RetryMin), r.cfg.RetryMax))
}

// fullSince is, per target and topic, since when the broker refuses rows
// for want of room, until it stores one of the topic: in this process (an
// instance that takes over a topic starts from RetryMin). A stream full
// with a per-subject limit refuses one topic and stores the others. A run
// of refusals with none for stale (2 × RetryMax: every refused row has been
// retried since) is over — another instance stored the topic's rows, or
// this one stopped publishing it — and the next refusal starts a new one.
type fullSince struct {
	n     atomic.Int32 // entries, so that a delivery reads no map while none is full
	mu    sync.Mutex
	since [2]map[string]fullRun
	swept time.Time // the last sweep of runs that are over (at the bound)
}

type fullRun struct{ since, last time.Time }

// maxFullTopics bounds the topics remembered; past it (after dropping the
// runs that are over), a refusal counts from now.
const maxFullTopics = 10000

// refused notes a refusal of topic by target ti at now, and returns since
// when its refusals run.
func (f *fullSince) refused(ti int, topic string, now time.Time, stale time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.since[ti]
	if m == nil {
		m = map[string]fullRun{}
		f.since[ti] = m
	}
	run, ok := m[topic]
	switch {
	case ok && now.Sub(run.last) <= stale:
		run.last = now
	case ok:
		run = fullRun{since: now, last: now}
	case int(f.n.Load()) >= maxFullTopics:
		if now.Sub(f.swept) >= time.Second { // a sweep walks every entry
			f.swept = now
			for _, mm := range f.since { // the bound is both targets'
				for t, r := range mm {
					if now.Sub(r.last) > stale {
						delete(mm, t)
						f.n.Add(-1)
					}
				}
			}
		}
		if int(f.n.Load()) >= maxFullTopics {
			return now
		}
		fallthrough
	default:
		run = fullRun{since: now, last: now}
		f.n.Add(1)
	}
	m[topic] = run
	return run.since
}

// stored ends the refusals of topic by target ti.
func (f *fullSince) stored(ti int, topic string) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.since[ti][topic]; ok {
		delete(f.since[ti], topic)
		f.n.Add(-1)
	}
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// rowQuerier is a connection or transaction that runs a query for one row.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// cleanup deletes the record of ids delivered more than Retention ago, in
// small batches.
func (r *Relay) cleanup(ctx context.Context) {
	errs := errlog.New(r.log, "cleanup")
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.CleanupOnce(ctx); err != nil && ctx.Err() == nil {
			errs.Error(err)
		} else {
			errs.OK()
		}
	}
}

// CleanupOnce finishes the next slice's stranded rows (finishStranded),
// then deletes, 1000 at a time, the record of delivered ids past
// retention, the backfill's record of moved ids past retention, and rows
// marked done in the outbox before migration 00005 past retention; it
// returns the first error.
func (r *Relay) CleanupOnce(ctx context.Context) error {
	// Each step on its own: one that fails does not keep the others from
	// their work.
	first := r.finishStranded(ctx)
	for _, q := range []string{r.store.cleanupDeliveredSQL, r.store.cleanupBackfilledSQL, r.store.cleanupSQL} {
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			tag, err := r.pool.Exec(ctx, q, r.cfg.Retention.Milliseconds(), 1000)
			if err != nil {
				first = cmp.Or(first, fmt.Errorf("cleanup: %w", err))
				break
			}
			if tag.RowsAffected() < 1000 {
				break
			}
		}
	}
	return first
}

// finishStranded moves out of the outbox rows JetStream has that no batch
// will finish in the nats-only phase: a batch claims only rows owed to an
// enabled target, so a row that reached JetStream while RabbitMQ still owed
// it (in retry, parked) is owed to no target once the phase is nats only —
// and never left. Only in that phase: a row RabbitMQ has and JetStream
// still owes stays through a move to amqp (back from dual write), so that it
// is sent when dual write resumes — and during a move to dual write,
// instances still in phase amqp must leave such rows to the dual-write ones.
//
// Each call (every cleanup) goes through the next slice of sweepSlice rows
// in id order, round and round: an outbox of up to that many rows at once,
// a backlog a slice a minute. Such rows are harmless leftovers, and a sweep
// of a whole backlog at once (no index finds them) cost the nats-only
// burn-down a twentieth of its rate.
func (r *Relay) finishStranded(ctx context.Context) error {
	if r.enabled != [2]bool{false, true} {
		return nil
	}
	r.sweepMu.Lock()
	defer r.sweepMu.Unlock()
	var last, scanned, n int64
	if err := r.pool.QueryRow(ctx, r.store.finishSQL, r.sweepFrom, r.sweepSlice).Scan(&last, &scanned, &n); err != nil {
		return fmt.Errorf("cleanup: finish rows JetStream has: %w", err)
	}
	r.sweepFrom = last
	if scanned < int64(r.sweepSlice) {
		r.sweepFrom = 0 // the end: from the start next time
	}
	if n > 0 {
		r.log.Info("finished rows JetStream has that RabbitMQ owed before the move to nats only", "rows", n)
	}
	return nil
}

// sweepSliceRows is how many outbox rows each finishStranded goes through.
const sweepSliceRows = 50000

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
