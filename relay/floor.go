package relay

import (
	"math"
	"sync"
	"time"

	"github.com/relayd/relayd/internal/outboxsql"
)

// claimFloor is where a relay's claims start their walks, so that during a
// backlog they skip the rows other batches hold (docs/design.md, "The claim
// floor"). Workers call begin, claimed and end around each claim.
type claimFloor struct {
	// An ordinary claim holds mu from begin to end, so one runs at a time; a
	// sweep takes it only to start and to finish. It guards every field.
	mu sync.Mutex

	batchSize int
	poll      time.Duration // the outbox's recheck runs this often while cheap

	// The owed table's unkeyed walks: advance writes these after each
	// ordinary claim, and begin reads them before the next.
	highWater int64 // the next walks start past it
	// Every unkeyed row owed in the owed table lies above safe, and so does
	// every row the outbox may still move there; rows put back below it
	// send it back (putBack).
	safe int64

	// The owed table's walk from the oldest row: in an ordinary claim while
	// it is cheap, else a sweep. It runs when asked (oldestWanted), and as a
	// backstop at least fullWalkEvery apart.
	oldestWanted   bool
	lastOldestWalk time.Time     // when the last one started
	oldestWalkTook time.Duration // what it took
	oldestWalking  bool          // a sweep of it is in flight

	fresh *freshFloor // the outbox's unkeyed walks
	keyed *keyedFloor // the outbox's keyed walks

	// owedFor is the phase whose targets the owed floors count: the
	// probes skip rows owed only to the others. A claim of a phase that
	// enables another target walks the owed table from its oldest row.
	owedFor phase

	// xmax is the newest ordinary claim's snapshot's, one past its newest
	// ended transaction: a lower one means the database went back in
	// history (reset).
	xmax int64
	gen  int // reset counts itself here; claimed ignores a sweep begun before
}

func newClaimFloor(batchSize int, poll time.Duration) *claimFloor {
	now := time.Now()
	return &claimFloor{batchSize: batchSize, poll: poll, lastOldestWalk: now, fresh: newFreshFloor(poll, now), keyed: newKeyedFloor()}
}

// floors is where one claim's walks start: the owed table's unkeyed walks
// and the probe of its lowest unkeyed row owed (owedSafe), its keyed walks
// and probe, and the outbox's unkeyed and keyed walks.
type floors struct {
	owed, owedSafe, owedKeyed int64
	fresh                     freshWalk
	keyed                     int64
	// An owed keyed row's probe of the outbox for an earlier row of its
	// key starts at freshKeyed, or at the from of a pending transaction
	// the claim's snapshot shows ended: 0 in a sweep.
	freshKeyed               int64
	pendingXIDs, pendingFrom []int64
	// oldest marks a sweep of the owed table from its oldest row: the
	// outbox is not walked.
	oldest  bool
	gen     int
	enabled phase // the targets the claim's phase enables
}

// beside reports whether the claim is a sweep: it runs beside the ordinary
// claims, without the floor's lock.
func (fl floors) beside() bool { return fl.fresh.belowFloor || fl.oldest }

// begin returns where one claim of phase enabled starts its walks. An
// ordinary claim holds the floor's lock until end; a sweep (fl.beside)
// does not: it walks only the outbox below where the ordinary claims start,
// or only the owed table from its oldest row.
func (f *claimFloor) begin(now time.Time, enabled phase) floors {
	f.mu.Lock()
	if w, ok := f.fresh.startSweep(now); ok {
		f.mu.Unlock()
		return floors{owed: math.MaxInt64, owedSafe: math.MaxInt64, owedKeyed: math.MaxInt64, fresh: w, keyed: math.MaxInt64, gen: f.gen}
	}
	fl := floors{owed: f.highWater, owedSafe: f.safe, owedKeyed: f.keyed.owed, fresh: f.fresh.start(), keyed: f.keyed.floor, gen: f.gen,
		freshKeyed: f.keyed.floor, enabled: enabled}
	for x, from := range f.keyed.pending {
		fl.pendingXIDs, fl.pendingFrom = append(fl.pendingXIDs, x), append(fl.pendingFrom, from)
	}
	if f.oldestWalkDue(now) {
		f.lastOldestWalk, f.oldestWanted = now, false
		if f.oldestWalkTook >= cheapWalkTook { // slow: beside the claims
			f.oldestWalking = true
			f.mu.Unlock()
			return floors{oldest: true, fresh: freshWalk{from: math.MaxInt64}, keyed: math.MaxInt64, gen: f.gen}
		}
		fl.owed, fl.owedSafe, fl.owedKeyed = 0, 0, 0
	}
	if !f.owedFor.covers(enabled) { // a target enabled again: its rows lie below the floors
		fl.owed, fl.owedSafe, fl.owedKeyed = 0, 0, 0
	}
	return fl
}

// claimed places the next claims after one that walked from fl under snap
// and took rows in took. It reports a reset: the database's transaction ids
// went back since the claim before.
func (f *claimFloor) claimed(rows []*claimed, fl floors, snap snapshot, took time.Duration) (reset bool) {
	wholeBatch := len(rows) >= f.batchSize
	if fl.beside() {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch {
		case fl.gen != f.gen:
		case fl.oldest:
			f.walkedFromOldest(snap, took)
		default:
			f.fresh.swept(rows, fl.fresh, snap, wholeBatch, took)
		}
		return false
	}
	// Ordinary claims run one after the other: their snapshots' xmax only
	// grows, on one history.
	if snap.xmax < f.xmax {
		f.reset()
		return true
	}
	f.xmax, f.owedFor = snap.xmax, fl.enabled
	f.fresh.advance(rows, fl.fresh, snap, wholeBatch, took)
	f.keyed.advance(snap, f.fresh.safe)
	if fl.owed == 0 {
		f.oldestWalkTook = took
	}
	f.advance(rows, fl.owed, snap)
	return false
}

// end ends the claim begin started: claimed, or not (ok false).
func (f *claimFloor) end(fl floors, ok bool) {
	if !fl.beside() {
		if !ok && fl.owed == 0 { // it may have been the walk from the oldest row
			f.oldestWanted = true
		}
		f.mu.Unlock()
		return
	}
	if !ok {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch {
		case fl.gen != f.gen:
		case fl.oldest:
			f.oldestWalking, f.oldestWanted = false, true
		default:
			f.fresh.unsweep(fl.fresh)
		}
	}
}

// reset forgets every floor, and the next claims walk from the oldest rows.
// The database went back to an earlier history (a standby promoted without
// the last transactions, a restore): its ids may come again, below the
// floors.
func (f *claimFloor) reset() {
	f.highWater, f.safe = 0, 0
	f.lastOldestWalk, f.oldestWalkTook, f.oldestWalking, f.oldestWanted = time.Now(), 0, false, false
	f.fresh, f.keyed = newFreshFloor(f.poll, time.Now()), newKeyedFloor()
	f.xmax, f.owedFor = 0, phase{}
	f.gen++
}

// sweepDue reports whether the next claim would be a sweep: a worker that
// would wait claims at once instead.
func (f *claimFloor) sweepDue(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fresh.sweepDue(now) || (f.oldestWalkDue(now) && f.oldestWalkTook >= cheapWalkTook)
}

// walkBack leaves a gap in the outbox's walks from row id on: a batch of
// this relay's ended unrecorded, and its rows are claimable again. Its
// record may still have committed (the reply lost) and moved them to the
// owed table: the owed walks go back there too.
func (f *claimFloor) walkBack(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fresh.walkBack(id)
	f.movedBelow(id)
}

// movedToOwed lowers the owed table's floor to row id: a batch of this
// relay's moved the outbox's unkeyed rows from id on there, below where
// the outbox's floor stands.
func (f *claimFloor) movedToOwed(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.movedBelow(id)
}

// putBack lowers the owed table's floors, keyed and not, to row id: rows
// from id on were put back in line from parked, or moved there by another
// relay's late confirms (the notification's payload).
func (f *claimFloor) putBack(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.movedBelow(id)
	f.keyed.owed = min(f.keyed.owed, id-1)
}

// owedFromOldest asks for the owed table's walk from the oldest row: rows
// may have been put back below its floors unannounced (the listener missed
// notifications).
func (f *claimFloor) owedFromOldest() {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Floors at 0 (no claim has moved them) walk from the oldest row anyway.
	f.oldestWanted = f.oldestWanted || f.highWater > 0 || f.safe > 0 || f.keyed.owed > 0
}

func (f *claimFloor) movedBelow(id int64) {
	f.safe = min(f.safe, id-1)
	f.highWater = min(f.highWater, f.safe)
}

// statsFloors is where the backlog figures start: the outbox's rows from
// freshFloor.lowest, the owed table's above its floors.
func (f *claimFloor) statsFloors() outboxsql.StatsParams {
	f.mu.Lock()
	defer f.mu.Unlock()
	return outboxsql.StatsParams{Floor: f.fresh.lowest(), OwedFloor: f.safe, OwedKeyedFloor: f.keyed.owed}
}

// oldestWalkDue reports whether the owed table's walk from the oldest row
// is due, no sweep of it being in flight: asked for, or as a backstop, as
// the outbox's.
func (f *claimFloor) oldestWalkDue(now time.Time) bool {
	return !f.oldestWalking && (f.oldestWanted || backstopDue(now, f.lastOldestWalk, f.oldestWalkTook))
}

// walkedFromOldest ends the owed table's walk from the oldest row, which
// took what it could under snap in took: the floors go back to any row still
// owed below them, and the ordinary claims take it (a whole batch: the rest).
func (f *claimFloor) walkedFromOldest(snap snapshot, took time.Duration) {
	f.oldestWalking, f.oldestWalkTook = false, took
	if snap.owedLow > 0 && snap.owedLow-1 < f.safe {
		f.safe = snap.owedLow - 1
		f.highWater = min(f.highWater, f.safe)
	}
	if snap.owedKeyedLow > 0 {
		f.keyed.owed = min(f.keyed.owed, snap.owedKeyedLow-1)
	}
}

// advance places the owed table's next unkeyed walks after an ordinary
// claim from floor that took rows under snap, after the outbox's floors
// moved: safe rises to just below the lowest row still owed the claim saw,
// or to where the outbox's rows may still move from (docs/design.md, "The
// claim floor"). A full claim moves the high-water mark, to its top if it
// walked from the oldest row; a short one starts the next walk at safe.
func (f *claimFloor) advance(rows []*claimed, floor int64, snap snapshot) {
	f.safe = f.fresh.movable()
	if snap.owedLow > 0 {
		f.safe = min(f.safe, snap.owedLow-1)
	}
	if len(rows) < f.batchSize {
		f.highWater = f.safe
		return
	}
	var top int64
	for _, c := range rows {
		if !c.msg.HasKey && !c.fresh {
			top = max(top, c.msg.ID)
		}
	}
	if floor == 0 {
		f.highWater = top
	} else {
		f.highWater = max(f.highWater, top)
	}
}
