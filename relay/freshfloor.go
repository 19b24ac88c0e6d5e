package relay

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// freshFloor is where claims walk the outbox's unkeyed rows, so that they
// pass a long transaction without waiting for it (docs/design.md, "The claim
// floor"). claimFloor's methods read and write it, under claimFloor.mu.
type freshFloor struct {
	poll time.Duration // recheck at least this often while that walk is cheap

	next int64 // advance sets where the next ordinary claim's walk starts
	// Every row below safe is taken, held by a batch, or belongs to a
	// transaction in pending; advance raises it to a walk's top.
	safe int64
	// pending maps each transaction running when safe passed its rows to
	// where those rows may start; a claim that sees it ended adds a gap there.
	pending  pendingTxs
	gaps     []span     // ranges below next no walk has taken since their rows became claimable
	sweeping *freshWalk // startSweep sets the sweep in flight; swept and unsweep clear it
	// The recheck walks from rechecked up to where the claims start, and
	// again the rows in held, which it last saw held by other batches: one
	// that rolls back after safe passed its rows leaves them below it.
	rechecked int64
	held      []int64
	// A near gap's walk may pass rows other batches hold there, so it sends
	// rechecked back to its start; recheckAgain keeps the lowest such start
	// since the recheck in flight began, which must not pass it.
	recheckAgain int64

	lastRecheck    time.Time
	recheckTook    time.Duration // what a recheck took past an ordinary claim
	claimTook      time.Duration // what the last ordinary claim took
	lastFromOldest time.Time     // when the last walk from the oldest row started
	fromOldestTook time.Duration // what that walk took
}

// span is the rows whose ids are in (from, to].
type span struct{ from, to int64 }

// Bounds of the walks below the floor, and how often they run
// (docs/design.md, "The claim floor").
const (
	cheapWalkTook = 20 * time.Millisecond // a recheck taking less runs every poll interval
	foldSpan      = 4096                  // the next claim walks a gap that starts within this many ids of next
	sweepSpan     = 1 << 13               // a sweep walks at most this many ids of a farther gap
	recheckShare  = 100                   // a recheck that is not cheap runs every this many times what it took
	fullWalkEvery = 5 * time.Minute       // the walk from the oldest row runs at least this often apart
	fullShare     = 200                   // ...and this many times what it took
	maxPending    = 4096                  // transactions remembered: with more running, safe waits
	maxGaps       = 256                   // gaps kept: with more, they merge into one
	maxHeld       = 1 << 16               // rows a recheck keeps: with more, the next walks them again
)

// pendingTxs is, per transaction that ran when a floor passed rows, where
// its rows may start.
type pendingTxs map[int64]int64

// remember notes each transaction snap shows unended not noted yet with
// from, and reports whether it did: not when that would pass maxPending, or
// when snap cannot bound them (snapshot.unended).
func (p pendingTxs) remember(snap snapshot, from int64) bool {
	xs, ok := snap.unended()
	if !ok || len(p)+len(xs) > maxPending {
		return false
	}
	for _, x := range xs {
		if _, ok := p[x]; !ok {
			p[x] = from
		}
	}
	return true
}

// ended forgets each transaction snap no longer shows running and returns
// where their rows may start.
func (p pendingTxs) ended(snap snapshot) []int64 {
	var froms []int64
	for x, from := range p {
		if !snap.running(x) {
			delete(p, x)
			froms = append(froms, from)
		}
	}
	return froms
}

func newFreshFloor(poll time.Duration, now time.Time) *freshFloor {
	return &freshFloor{poll: poll, pending: map[int64]int64{}, lastRecheck: now, lastFromOldest: now, recheckAgain: math.MaxInt64}
}

// freshWalk is the outbox rows a claim walks: those in (from, to], and why.
// claimFloor.begin hands one to each claim; the claim passes it back.
type freshWalk struct {
	from, to int64 // to: a sweep's last row; an ordinary claim's walk has no end
	// belowFloor marks a sweep: it walks below where the ordinary claims
	// start, beside them, without the claim floor's lock.
	belowFloor bool
	recheck    bool    // the sweep walks from freshFloor.rechecked, and the rows in ids
	ids        []int64 // the rows the last recheck saw held by other batches
	fromOldest bool    // the sweep walks from the oldest row
	gaps       []span  // the gaps the sweep walks, which it gives back if it fails
}

// start is the next ordinary claim's walk: from next, or from below it to
// the near gaps.
func (f *freshFloor) start() freshWalk {
	w := freshWalk{from: f.next}
	for _, g := range f.gaps {
		if !f.far(g) {
			w.from = min(w.from, g.from)
		}
	}
	return w
}

// startSweep returns the sweep due, if any and none is in flight: the
// walk from the oldest row, the far gaps from the lowest, or a recheck.
// Each ends where the ordinary claims start, and takes the gaps it covers.
func (f *freshFloor) startSweep(now time.Time) (freshWalk, bool) {
	if f.sweeping != nil {
		return freshWalk{}, false
	}
	w := freshWalk{to: max(f.next, f.safe), belowFloor: true}
	switch {
	case f.fromOldestDue(now):
		f.lastFromOldest = now
		w.fromOldest = true
	case f.farGap(&w):
		w.to = min(w.to, w.from+sweepSpan)
	case f.recheckDue(now):
		f.lastRecheck, f.recheckAgain = now, math.MaxInt64
		w.from, w.recheck, w.ids = min(f.rechecked, w.to), true, f.held
	default:
		return freshWalk{}, false
	}
	// The gaps it covers are its own; of one it covers in part, the rest
	// stays.
	for i, g := range f.gaps {
		if g.from < w.from || g.from >= w.to {
			continue
		}
		w.gaps = append(w.gaps, span{g.from, min(g.to, w.to)})
		f.gaps[i].from = w.to
	}
	f.gaps = slices.DeleteFunc(f.gaps, func(g span) bool { return g.from >= g.to })
	f.sweeping = &w
	return w, true
}

// farGap sets w to the lowest far gap and every gap it overlaps, if any.
func (f *freshFloor) farGap(w *freshWalk) bool {
	slices.SortFunc(f.gaps, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	for i, g := range f.gaps {
		if !f.far(g) {
			continue
		}
		w.from, w.to = g.from, g.to
		for _, o := range f.gaps[i+1:] {
			if o.from <= w.to {
				w.to = max(w.to, o.to)
			}
		}
		return true
	}
	return false
}

// sweepDue reports whether a claim now would be a sweep.
func (f *freshFloor) sweepDue(now time.Time) bool {
	if f.sweeping != nil {
		return false
	}
	return f.fromOldestDue(now) || slices.ContainsFunc(f.gaps, f.far) || f.recheckDue(now)
}

// far reports whether gap g is a sweep's, not the next claim's.
func (f *freshFloor) far(g span) bool { return f.next-g.from > foldSpan }

func (f *freshFloor) fromOldestDue(now time.Time) bool {
	return backstopDue(now, f.lastFromOldest, f.fromOldestTook)
}

// backstopDue reports whether a walk from the oldest row, of the outbox or
// of the owed table, is due as a backstop: last started then and took took.
func backstopDue(now, last time.Time, took time.Duration) bool {
	return now.Sub(last) >= max(fullWalkEvery, fullShare*took)
}

func (f *freshFloor) recheckDue(now time.Time) bool {
	return now.Sub(f.lastRecheck) >= f.recheckEvery()
}

func (f *freshFloor) recheckEvery() time.Duration {
	if f.recheckTook < cheapWalkTook {
		return f.poll
	}
	return max(f.poll, recheckShare*f.recheckTook)
}

// topOf is the highest of the outbox's unkeyed rows in rows, or 0.
func topOf(rows []*claimed) int64 {
	var top int64
	for _, c := range rows {
		if c.fresh && !c.msg.HasKey {
			top = max(top, c.msg.ID)
		}
	}
	return top
}

// advance places the next walks after an ordinary claim that walked w
// under snap and took rows (the outbox's unkeyed ones among them count) in
// took. full says the claim took a whole batch: its walk may have stopped
// short.
func (f *freshFloor) advance(rows []*claimed, w freshWalk, snap snapshot, wholeBatch bool, took time.Duration) {
	if w.from == f.next {
		f.claimTook = took
	}
	top := topOf(rows)
	// The gaps from its start on: this walk took their rows, or the next
	// ones go on from its top.
	f.gaps = slices.DeleteFunc(f.gaps, func(g span) bool { return g.from >= w.from })
	// A transaction that ended before snap: its rows from w.from on were
	// visible to this walk; those below are a gap.
	for _, from := range f.pending.ended(snap) {
		if from < w.from {
			f.addGap(span{from, w.from})
		}
	}
	if w.from < f.safe { // a near gap's walk
		f.recheckFrom(w.from)
	}
	f.raise(w, top, snap)
	if wholeBatch {
		// Rows may be left past its top (from its start, if it took none):
		// the next walk goes on from there, below the mark if it started
		// below it.
		if w.from < f.next {
			f.next = max(top, w.from)
		} else {
			f.next = max(f.next, top)
		}
		return
	}
	f.next = f.safe
}

// raise moves safe to the top of a walk from at or below it: every row from
// safe to its top the walk did not take is held by a batch, or belongs to a
// transaction running at snap, remembered from safe (below it, a running
// transaction's rows are remembered already). A full walk too, so that during
// a backlog the next short one does not walk back over the rows the full ones took.
func (f *freshFloor) raise(w freshWalk, top int64, snap snapshot) {
	if w.from <= f.safe && top > f.safe && f.pending.remember(snap, f.safe) {
		f.safe = top
	}
}

// swept ends the sweep w, which took rows under snap in took; full says it
// took a whole batch, and stopped at its top: the rest is a gap. A recheck
// goes on from its end next time, and walks again the rows it saw and did
// not take (snap.left: held by other batches, or past its batch); so does
// the recheck after any other sweep, of the rows that sweep saw held.
func (f *freshFloor) swept(rows []*claimed, w freshWalk, snap snapshot, wholeBatch bool, took time.Duration) {
	left := snap.left
	f.sweeping = nil
	switch {
	case w.fromOldest:
		f.fromOldestTook = took
	case w.recheck:
		// Its rows are passed: a transaction running at its snapshot may
		// have rows among them above safe, as at a raise of safe. A near
		// gap's walk since it began sends the next one back there.
		f.recheckTook = max(0, took-f.claimTook)
		if len(left) <= maxHeld && f.pending.remember(snap, max(w.from, f.safe)) {
			f.rechecked, f.held = min(w.to, f.recheckAgain), left
		}
		return
	}
	f.recheckHeld(left, w.from)
	if wholeBatch {
		f.addGap(span{max(topOf(rows), w.from), w.to})
	}
}

// recheckHeld hands the recheck the rows ids a sweep passed held by other
// batches: it walks them again until their batches end. With too many, it
// walks again from the sweep's start, from. Sweeps run one at a time, so no
// recheck is in flight.
func (f *freshFloor) recheckHeld(ids []int64, from int64) {
	switch {
	case len(ids) == 0:
	case len(f.held)+len(ids) > maxHeld:
		f.recheckFrom(from)
	default:
		f.held = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(f.held), ids...))))
	}
}

// recheckFrom sends the next recheck back to row id at least, and keeps a
// recheck in flight from going past it.
func (f *freshFloor) recheckFrom(id int64) {
	f.rechecked, f.recheckAgain = min(f.rechecked, id), min(f.recheckAgain, id)
}

// unsweep ends the sweep w, which failed: its gaps are owed again.
func (f *freshFloor) unsweep(w freshWalk) {
	f.sweeping = nil
	for _, g := range w.gaps {
		f.addGap(g)
	}
}

func (f *freshFloor) addGap(g span) {
	f.gaps = append(f.gaps, g)
	if len(f.gaps) > maxGaps {
		all := span{from: math.MaxInt64}
		for _, g := range f.gaps {
			all = span{min(all.from, g.from), max(all.to, g.to)}
		}
		f.gaps = append(f.gaps[:0], all)
	}
}

// walkBack leaves a gap from row id on: a batch of this relay's rolled
// back, and its rows are claimable again, below the floor.
func (f *freshFloor) walkBack(id int64) {
	if id-1 < f.next { // else the next claim walks them
		f.addGap(span{id - 1, max(f.next, f.safe)})
	}
}

// lowest is the lowest id a committed row still owed in the outbox may
// have: where the backlog figures start, and above which the outbox's rows
// may still move to the owed table. A remembered transaction's rows are
// left out: no read sees them before it commits, and from then a claim
// takes them.
func (f *freshFloor) lowest() int64 {
	low := min(f.rechecked, f.movable())
	if len(f.held) > 0 {
		low = min(low, f.held[0])
	}
	return low
}

// movable is the lowest id a row may have that is still in the outbox and
// that a batch of this relay's may yet claim, or one of another relay's
// running when the floor passed it; below it the outbox's rows may still
// move to the owed table only in batches of this relay's in flight.
func (f *freshFloor) movable() int64 {
	low := min(f.next, f.safe)
	for _, g := range f.gaps {
		low = min(low, g.from)
	}
	if f.sweeping != nil {
		for _, g := range f.sweeping.gaps {
			low = min(low, g.from)
		}
	}
	return low
}
