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
	// lease is how long a batch may hold rows: another relay's batch that
	// rolls back after safe passed its rows leaves them below it, and the
	// recheck walks from where safe was a lease ago.
	lease time.Duration
	poll  time.Duration // recheck at least this often while that walk is cheap

	next     int64           // where the next claim's walk starts
	safe     int64           // see above
	pending  map[int64]int64 // a transaction that ran at a raise of safe: where its rows may start
	gaps     []span          // below next: rows no walk has taken since they became claimable
	sweeping *freshWalk      // the sweep in flight, or nil
	marks    []floorMark     // safe as it was, for the recheck

	lastRecheck time.Time
	recheckTook time.Duration // what a recheck took past an ordinary claim
	claimTook   time.Duration // what the last ordinary claim took
	lastFull    time.Time
	fullTook    time.Duration
}

// span is the rows whose ids are in (from, to].
type span struct{ from, to int64 }

// batchLease is how long a batch may hold rows: its publish timeout and the
// record's 30 s (runBatch), or, if its relay froze, until Postgres ends the
// session (idle_in_transaction_session_timeout, 2 × the publish timeout +
// 30 s, cmd/relayd); and a margin.
func batchLease(publishTimeout time.Duration) time.Duration {
	return 2*publishTimeout + 35*time.Second
}

// floorMark is safe as it was at a time.
type floorMark struct {
	at   time.Time
	safe int64
}

// Bounds of the walks below the floor. A gap that starts within foldSpan
// ids of next is walked by the next claim (a few milliseconds at most, dead
// rows and all); a farther one by sweeps of up to sweepSpan ids each, so
// that the rows at its start, an ended transaction's first, go out after
// one of them, not after the whole gap's dead rows. A recheck runs every poll while
// it takes under cheapWalkTook more than an ordinary claim, else every
// recheckShare times that; the walk from the oldest row (for a batch that
// held rows past its lease) every fullWalkEvery at least, and fullShare
// times what it took.
const (
	foldSpan      = 4096
	sweepSpan     = 1 << 16
	recheckShare  = 100
	fullWalkEvery = 5 * time.Minute
	fullShare     = 200
	markEvery     = 100 * time.Millisecond
	// maxPending bounds the transactions remembered: with more running, the
	// floor waits, as it did before the first claim. maxGaps bounds the
	// gaps: with more, they become one.
	maxPending = 4096
	maxGaps    = 256
)

func newFreshFloor(poll, lease time.Duration, now time.Time) *freshFloor {
	return &freshFloor{poll: poll, lease: lease, pending: map[int64]int64{},
		marks: []floorMark{{at: now}}, lastRecheck: now, lastFull: now}
}

// freshWalk is the outbox rows a claim walks: those in (from, to], and why.
type freshWalk struct {
	from, to int64  // to: a sweep's last row; an ordinary claim's walk has no end
	sweep    bool   // below the floor, beside the claims
	recheck  bool   // a sweep from where safe was a lease ago
	full     bool   // a sweep from the oldest row
	gaps     []span // the gaps a sweep walks
}

// start is the next ordinary claim's walk: from next, or from below it to
// the near gaps.
func (f *freshFloor) start() freshWalk {
	w := freshWalk{from: f.next}
	for _, g := range f.gaps {
		if f.next-g.from <= foldSpan {
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
	case now.Sub(f.lastFull) >= max(fullWalkEvery, fullShare*f.fullTook):
		f.lastFull = now
		w.full = true
	case f.farGap(&w):
		w.to = min(w.to, w.from+sweepSpan)
	case now.Sub(f.lastRecheck) >= f.recheckEvery():
		f.lastRecheck = now
		w.from, w.recheck = min(f.markBefore(now.Add(-f.lease-f.recheckEvery())), w.to), true
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
		if f.next-g.from <= foldSpan {
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
	return now.Sub(f.lastFull) >= max(fullWalkEvery, fullShare*f.fullTook) ||
		slices.ContainsFunc(f.gaps, func(g span) bool { return f.next-g.from > foldSpan }) ||
		now.Sub(f.lastRecheck) >= f.recheckEvery()
}

func (f *freshFloor) recheckEvery() time.Duration {
	if f.recheckTook < cheapWalkTook {
		return f.poll
	}
	return max(f.poll, recheckShare*f.recheckTook)
}

// markBefore is safe as it was at t: the newest mark at or before it, else
// the oldest kept.
func (f *freshFloor) markBefore(t time.Time) int64 {
	at := f.marks[0].safe
	for _, m := range f.marks {
		if m.at.After(t) {
			break
		}
		at = m.safe
	}
	return at
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
func (f *freshFloor) advance(rows []*claimed, w freshWalk, snap snapshot, full bool, now time.Time, took time.Duration) {
	if w.from == f.next {
		f.claimTook = took
	}
	top := topOf(rows)
	// The gaps from its start on: this walk took their rows, or the next
	// ones go on from its top.
	f.gaps = slices.DeleteFunc(f.gaps, func(g span) bool { return g.from >= w.from })
	// A transaction that ended before snap: its rows from w.from on were
	// visible to this walk; those below are a gap.
	for x, from := range f.pending {
		if snap.running(x) {
			continue
		}
		delete(f.pending, x)
		if from < w.from {
			f.addGap(span{from, w.from})
		}
	}
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
	// A short walk from at or below safe reached the end: every row from
	// safe to its top it did not take is held by a batch, or belongs to a
	// transaction running at snap.
	if w.from <= f.safe && top > f.safe && len(f.pending)+len(snap.xip) <= maxPending {
		for _, x := range snap.xip {
			if _, ok := f.pending[x]; !ok {
				f.pending[x] = f.safe
			}
		}
		f.mark(now)
		f.safe = top
	}
	f.next = f.safe
}

// swept ends the sweep w, which took rows in took; full says it took a
// whole batch, and stopped at its top: the rest is a gap.
func (f *freshFloor) swept(rows []*claimed, w freshWalk, full bool, took time.Duration) {
	f.sweeping = nil
	switch {
	case w.full:
		f.fullTook = took
	case w.recheck:
		f.recheckTook = max(0, took-f.claimTook)
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

// mark notes safe before it moves, one mark per markEvery (an earlier,
// lower mark stands for a later one), and forgets those the recheck no
// longer needs.
func (f *freshFloor) mark(now time.Time) {
	if last := f.marks[len(f.marks)-1]; now.Sub(last.at) >= markEvery {
		f.marks = append(f.marks, floorMark{at: now, safe: f.safe})
	}
	keep := now.Add(-f.lease - f.recheckEvery() - time.Minute)
	i := 0
	for i+1 < len(f.marks) && !f.marks[i+1].at.After(keep) {
		i++
	}
	f.marks = f.marks[i:]
}

// walkBack leaves a gap from row id on: a batch of this relay's rolled
// back, and its rows are claimable again, below the floor.
func (f *freshFloor) walkBack(id int64) {
	if id-1 < f.next { // else the next claim walks them
		f.addGap(span{id - 1, max(f.next, f.safe)})
	}
}

// lowest is where the backlog figures start: the lowest id a committed row
// still owed in the outbox may have, but for a batch that held rows past its
// lease. A remembered transaction's rows are left out: no read sees them
// before it commits, and from then a claim takes them.
func (f *freshFloor) lowest(now time.Time) int64 {
	low := min(f.markBefore(now.Add(-f.lease)), f.next)
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
