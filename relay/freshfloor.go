package relay

import (
	"time"
)

// freshFloor is where a claim's walk of the outbox's unkeyed rows starts
// (docs/design.md, "The claim floor"). Below safe, every such row is taken,
// held by a batch, or belongs to a transaction a claim's snapshot showed
// running; pending keeps, for each of those, where its rows may start. The
// first claim that sees one ended walks back there once. So a transaction
// that stays open holds back nothing but that one walk: the claims never
// wait for it, nor walk the rows deleted meanwhile, which it keeps on disk.
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

	next    int64           // where the next walk starts
	safe    int64           // see above
	pending map[int64]int64 // a transaction that ran at a raise of safe: where its rows may start
	back    int64           // walk back from here at the next claim; -1: no
	marks   []floorMark     // safe as it was, for the recheck

	lastRecheck time.Time
	recheckTook time.Duration // what a recheck took past an ordinary claim
	claimTook   time.Duration // what the last ordinary claim took
	lastFull    time.Time
	fullTook    time.Duration
}

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

// Cost bounds of the walks from below the floor: a recheck runs every poll
// while it takes under cheapWalkTook more than an ordinary claim (a busy
// machine slows both), else every recheckShare times that; the walk from the
// oldest row (for a batch that held rows past its lease) every
// fullWalkEvery at least, and fullShare times what it took.
const (
	recheckShare  = 100
	fullWalkEvery = 5 * time.Minute
	fullShare     = 200
	markEvery     = 100 * time.Millisecond
	// maxPending bounds the transactions remembered: with more running, the
	// floor waits, as it did before the first claim.
	maxPending = 4096
)

func newFreshFloor(poll, lease time.Duration, now time.Time) *freshFloor {
	return &freshFloor{poll: poll, lease: lease, pending: map[int64]int64{}, back: -1,
		marks: []floorMark{{at: now}}, lastRecheck: now, lastFull: now}
}

// freshWalk is where a claim's walk of the outbox starts, and why.
type freshWalk struct {
	from    int64
	recheck bool // from where safe was a lease ago
	full    bool // from the oldest row
}

// start is where the next claim walks from: back to a transaction that
// ended, or a batch of this relay's that rolled back; from where safe was a
// lease ago when a recheck is due; from the oldest row when that is due;
// else from next.
func (f *freshFloor) start(now time.Time) freshWalk {
	switch {
	case f.back >= 0:
		return freshWalk{from: min(f.back, f.next)}
	case now.Sub(f.lastFull) >= max(fullWalkEvery, fullShare*f.fullTook):
		f.lastFull = now
		return freshWalk{from: 0, full: true}
	case now.Sub(f.lastRecheck) >= f.recheckEvery():
		f.lastRecheck = now
		return freshWalk{from: min(f.markBefore(now.Add(-f.lease-f.recheckEvery())), f.next), recheck: true}
	}
	return freshWalk{from: f.next}
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

// advance places the next walks after a claim that walked from w under
// snap and took rows (the outbox's unkeyed ones among them count) in took.
// full says the claim took a whole batch: its walk may have stopped short.
func (f *freshFloor) advance(rows []*claimed, w freshWalk, snap snapshot, full bool, now time.Time, took time.Duration) {
	switch {
	case w.full:
		f.fullTook = took
	case w.recheck:
		f.recheckTook = max(0, took-f.claimTook)
	case w.from == f.next:
		f.claimTook = took
	}
	var top int64
	for _, c := range rows {
		if c.fresh && !c.msg.HasKey {
			top = max(top, c.msg.ID)
		}
	}
	// A transaction that ended before snap: its rows from `from` on were
	// visible to this walk, if it started there; else walk back to them.
	for x, from := range f.pending {
		switch {
		case snap.running(x):
		case w.from <= from:
			delete(f.pending, x)
		case f.back < 0 || from < f.back:
			f.back = from
		}
	}
	if f.back >= 0 && w.from <= f.back {
		f.back = -1
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

// walkBack makes the next claim walk from id: a batch of this relay's that
// rolled back left its rows claimable again, below the floor.
func (f *freshFloor) walkBack(id int64) {
	if f.back < 0 || id < f.back {
		f.back = id
	}
}

// lowest is where the backlog figures start: the lowest id a committed row
// still owed in the outbox may have, but for a batch that held rows past its
// lease. A remembered transaction's rows are left out: no read sees them
// before it commits, and from then the next claim takes them.
func (f *freshFloor) lowest(now time.Time) int64 {
	low := min(f.markBefore(now.Add(-f.lease)), f.next)
	if f.back >= 0 {
		low = min(low, f.back)
	}
	return low
}
