package relay

import (
	"math"
	"sync"
	"time"
)

// claimFloor is where a relay's claims start their walks, so that during a
// backlog they skip the rows other batches hold (docs/design.md, "The claim
// floor"). Workers call begin, claimed and end around each claim.
type claimFloor struct {
	// An ordinary claim holds mu from begin to end, so one runs at a time; a
	// sweep takes it only to start and to finish. It guards every field.
	mu sync.Mutex

	batchSize int
	poll      time.Duration // walk from the oldest row at least this often
	quickWalk time.Duration // ...and this often while that walk is cheap
	cheapTook time.Duration // the longest a cheap walk from the oldest row takes

	// The owed table's unkeyed walks: advance writes these after each
	// ordinary claim, and start reads them before the next.
	highWater       int64 // the next walks start past it
	lastOldestWalk  int64 // unix ns of the last walk from the oldest row
	oldestWalkCheap bool  // the last walk from the oldest row was short and quick
	// Every unkeyed row owed in the owed table lies above safe, and so does
	// every row the outbox may still move there, but for rows put back from
	// parked: the walk from the oldest row takes those.
	safe int64

	fresh *freshFloor // the outbox's unkeyed walks
	keyed *keyedFloor // the outbox's keyed walks

	// xmax is the newest ordinary claim's first unassigned transaction id: a
	// lower one means the database went back in history (reset).
	xmax int64
	gen  int // reset counts itself here; claimed ignores a sweep begun before
}

// quickWalkEvery is how often, at most, claims walk from the oldest row
// while that walk is cheap; cheapWalkTook is what counts as cheap.
const (
	quickWalkEvery = 100 * time.Millisecond
	cheapWalkTook  = 20 * time.Millisecond
)

func newClaimFloor(batchSize int, poll time.Duration) *claimFloor {
	return &claimFloor{batchSize: batchSize, poll: poll, quickWalk: quickWalkEvery, cheapTook: cheapWalkTook,
		fresh: newFreshFloor(poll, time.Now()), keyed: newKeyedFloor()}
}

// floors is where one claim's walks start: the owed table's unkeyed walks
// and the probe of its lowest unkeyed row owed (owedSafe), its keyed walks
// and probe, and the outbox's unkeyed and keyed walks.
type floors struct {
	owed, owedSafe, owedKeyed int64
	fresh                     freshWalk
	keyed                     int64
	gen                       int
}

// begin returns where one claim's walks start. An ordinary claim holds the
// floor's lock until end; a sweep (fl.fresh.belowFloor) does not: it walks
// only the outbox, below where the ordinary claims start.
func (f *claimFloor) begin(now time.Time) floors {
	f.mu.Lock()
	if w, ok := f.fresh.startSweep(now); ok {
		f.mu.Unlock()
		return floors{owed: math.MaxInt64, owedSafe: math.MaxInt64, owedKeyed: math.MaxInt64, fresh: w, keyed: math.MaxInt64, gen: f.gen}
	}
	fl := floors{owed: f.start(now), owedSafe: f.safe, owedKeyed: f.keyed.owed, fresh: f.fresh.start(), keyed: f.keyed.floor, gen: f.gen}
	if fl.owed == 0 { // the walk from the oldest row: the keyed walks too
		fl.owedSafe, fl.owedKeyed = 0, 0
	}
	return fl
}

// claimed places the next claims after one that walked from fl under snap
// and took rows in took. It reports a reset: the database's transaction ids
// went back since the claim before.
func (f *claimFloor) claimed(rows []*claimed, fl floors, snap snapshot, took time.Duration) (reset bool) {
	wholeBatch := len(rows) >= f.batchSize
	if fl.fresh.belowFloor {
		f.mu.Lock()
		defer f.mu.Unlock()
		if fl.gen == f.gen {
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
	f.xmax = snap.xmax
	f.fresh.advance(rows, fl.fresh, snap, wholeBatch, took)
	f.keyed.advance(snap, f.fresh.safe)
	f.advance(rows, fl.owed, snap, took)
	return false
}

// end ends the claim begin started: claimed, or not (ok false).
func (f *claimFloor) end(fl floors, ok bool) {
	if !fl.fresh.belowFloor {
		f.mu.Unlock()
		return
	}
	if !ok {
		f.mu.Lock()
		defer f.mu.Unlock()
		if fl.gen == f.gen {
			f.fresh.unsweep(fl.fresh)
		}
	}
}

// reset forgets every floor, and the next claims walk from the oldest rows.
// The database went back to an earlier history (a standby promoted without
// the last transactions, a restore): its ids may come again, below the
// floors.
func (f *claimFloor) reset() {
	f.highWater, f.lastOldestWalk, f.oldestWalkCheap, f.safe = 0, 0, false, 0
	f.fresh, f.keyed = newFreshFloor(f.poll, time.Now()), newKeyedFloor()
	f.xmax = 0
	f.gen++
}

// sweepDue reports whether the next claim would be a sweep: a worker that
// would wait claims at once instead.
func (f *claimFloor) sweepDue(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fresh.sweepDue(now)
}

// walkBack leaves a gap in the outbox's walks from row id on: a batch of
// this relay's rolled back, and its rows are claimable again.
func (f *claimFloor) walkBack(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fresh.walkBack(id)
}

// movedToOwed lowers the owed table's floor to row id: a batch of this
// relay's moved the outbox's unkeyed rows from id on there, below where
// the outbox's floor stands.
func (f *claimFloor) movedToOwed(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.safe = min(f.safe, id-1)
	f.highWater = min(f.highWater, f.safe)
}

// lowestFresh is where the outbox's backlog figures start (freshFloor.lowest).
func (f *claimFloor) lowestFresh() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fresh.lowest()
}

// start is where a claim's unkeyed walks start: the high-water mark, or 0
// (the oldest row) at least every poll, and every quickWalk while that walk
// is cheap, to take what the mark skips.
func (f *claimFloor) start(now time.Time) int64 {
	every := int64(f.poll)
	if f.oldestWalkCheap {
		every = min(every, int64(f.quickWalk))
	}
	if now.UnixNano()-f.lastOldestWalk >= every {
		f.lastOldestWalk = now.UnixNano()
		return 0
	}
	return f.highWater
}

// advance places the owed table's next walks after a claim from floor that
// took rows (the owed table's unkeyed ones count) in took under snap, after
// the outbox's floors moved: a full claim moves the high-water mark; safe
// rises to just below the lowest row still owed the claim saw, or to where
// the outbox's rows may still start (docs/design.md, "The claim floor").
func (f *claimFloor) advance(rows []*claimed, floor int64, snap snapshot, took time.Duration) {
	wholeBatch := len(rows) >= f.batchSize
	if floor == 0 {
		f.oldestWalkCheap = !wholeBatch && took < f.cheapTook
	}
	var top int64
	for _, c := range rows {
		if !c.msg.HasKey && !c.fresh {
			top = max(top, c.msg.ID)
		}
	}
	f.safe = f.fresh.lowest()
	if snap.owedLow > 0 {
		f.safe = min(f.safe, snap.owedLow-1)
	}
	switch {
	case wholeBatch && floor == 0:
		// More claimable rows below the mark than a batch (a target back
		// from an outage, retries falling due): walk on from here.
		f.highWater = top
	case wholeBatch:
		f.highWater = max(f.highWater, top)
	default:
		f.highWater = f.safe
	}
}
