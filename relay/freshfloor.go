package relay

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// freshFloor is where claims walk the outbox's unkeyed rows (docs/design.md,
// "The claim floor"). Below safe, every such row is taken, held by a batch,
// or belongs to a transaction a claim's snapshot showed running; pending
// keeps, for each of those, where its rows may start. The first claim that
// sees one ended leaves a gap: its rows below where that claim started. So
// a transaction that stays open holds back nothing but one walk over its
// gap: the claims never wait for it, nor walk the rows deleted meanwhile,
// which it keeps on disk.
//
// A gap close below next is walked by the next claim. A far one, the
// recheck and the walk from the oldest row are sweeps: claims of their own,
// bounded above, that run beside the ordinary claims instead of holding
// them back while they step over a held horizon's dead rows.
//
// It relies on a row's id being taken once its transaction has a
// transaction id (migration 00018): a row below the newest one a snapshot
// sees, and not visible to it, is then a running transaction's.
type freshFloor struct {
	poll time.Duration // recheck at least this often while that walk is cheap

	next     int64      // where the next claim's walk starts
	safe     int64      // see above
	pending  pendingTxs // a transaction that ran at a raise of safe: where its rows may start
	gaps     []span     // below next: rows no walk has taken since they became claimable
	sweeping *freshWalk // the sweep in flight, or nil
	// Another relay's batch that rolls back after safe passed its rows
	// leaves them below it. The recheck walks the rows from rechecked to
	// where the claims start, and those it saw and did not take the time
	// before (held).
	rechecked int64
	held      []int64

	lastRecheck time.Time
	recheckTook time.Duration // what a recheck took past an ordinary claim
	claimTook   time.Duration // what the last ordinary claim took
	lastFull    time.Time
	fullTook    time.Duration
}

// span is the rows whose ids are in (from, to].
type span struct{ from, to int64 }

// Bounds of the walks below the floor. A gap that starts within foldSpan
// ids of next is walked by the next claim (a few milliseconds at most, dead
// rows and all); a farther one by sweeps of up to sweepSpan ids each, so
// that the rows at its start, an ended transaction's first, go out after
// one of them, not after the whole gap's dead rows. A recheck runs every poll while
// it takes under cheapWalkTook more than an ordinary claim, else every
// recheckShare times that; the walk from the oldest row (for a row whose
// id its producer set) every fullWalkEvery at least, and fullShare times
// what it took.
const (
	foldSpan      = 4096
	sweepSpan     = 1 << 16
	recheckShare  = 100
	fullWalkEvery = 5 * time.Minute
	fullShare     = 200
	// maxPending bounds the transactions remembered: with more running, the
	// floor waits, as it did before the first claim. maxGaps bounds the
	// gaps: with more, they become one. maxHeld bounds the rows a recheck
	// keeps: with more, the next walks the same rows again.
	maxPending = 4096
	maxGaps    = 256
	maxHeld    = 1 << 16
)

// pendingTxs is, per transaction that ran when a floor passed rows, where
// its rows may start.
type pendingTxs map[int64]int64

// remember notes each of xip not noted yet with from, and reports whether it
// did: not when that would pass maxPending.
func (p pendingTxs) remember(xip []int64, from int64) bool {
	if len(p)+len(xip) > maxPending {
		return false
	}
	for _, x := range xip {
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
	return &freshFloor{poll: poll, pending: map[int64]int64{}, lastRecheck: now, lastFull: now}
}

// freshWalk is the outbox rows a claim walks: those in (from, to], and why.
type freshWalk struct {
	from, to int64   // to: a sweep's last row; an ordinary claim's walk has no end
	sweep    bool    // below the floor, beside the claims
	recheck  bool    // a sweep from rechecked, and of ids
	ids      []int64 // the rows a recheck saw held before
	full     bool    // a sweep from the oldest row
	gaps     []span  // the gaps a sweep walks
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
	w := freshWalk{to: max(f.next, f.safe), sweep: true}
	switch {
	case f.fullDue(now):
		f.lastFull = now
		w.full = true
	case f.farGap(&w):
		w.to = min(w.to, w.from+sweepSpan)
	case f.recheckDue(now):
		f.lastRecheck = now
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
	return f.fullDue(now) || slices.ContainsFunc(f.gaps, f.far) || f.recheckDue(now)
}

// far reports whether gap g is a sweep's, not the next claim's.
func (f *freshFloor) far(g span) bool { return f.next-g.from > foldSpan }

func (f *freshFloor) fullDue(now time.Time) bool {
	return now.Sub(f.lastFull) >= max(fullWalkEvery, fullShare*f.fullTook)
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
func (f *freshFloor) advance(rows []*claimed, w freshWalk, snap snapshot, full bool, took time.Duration) {
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
	f.raise(w, top, snap)
	if full {
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
// transaction running at snap. A full walk too, so that during a backlog
// the next short one does not walk back over the rows the full ones took.
func (f *freshFloor) raise(w freshWalk, top int64, snap snapshot) {
	if w.from <= f.safe && top > f.safe && f.pending.remember(snap.xip, f.safe) {
		f.safe = top
	}
}

// swept ends the sweep w, which took rows under snap in took; full says it
// took a whole batch, and stopped at its top: the rest is a gap. A recheck
// goes on from its end next time, and walks again the rows it saw and did
// not take (snap.left: held by other batches, or past its batch).
func (f *freshFloor) swept(rows []*claimed, w freshWalk, snap snapshot, full bool, took time.Duration) {
	left := snap.left
	f.sweeping = nil
	switch {
	case w.full:
		f.fullTook = took
	case w.recheck:
		// Its rows are passed: a transaction running at its snapshot may
		// have rows among them, as at a raise of safe.
		f.recheckTook = max(0, took-f.claimTook)
		if len(left) <= maxHeld && f.pending.remember(snap.xip, w.from) {
			f.rechecked, f.held = w.to, left
		}
		return
	}
	if full {
		f.addGap(span{max(topOf(rows), w.from), w.to})
	}
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

// lowest is where the backlog figures start: the lowest id a committed row
// still owed in the outbox may have. A remembered transaction's rows are
// left out: no read sees them before it commits, and from then a claim
// takes them.
func (f *freshFloor) lowest() int64 {
	low := min(f.rechecked, f.next)
	if len(f.held) > 0 {
		low = min(low, f.held[0])
	}
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
