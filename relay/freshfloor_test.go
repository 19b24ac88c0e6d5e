package relay

import (
	"maps"
	"testing"
	"time"
)

func fresh(ids ...int64) []*claimed {
	rows := unkeyed(ids...)
	for _, c := range rows {
		c.fresh = true
	}
	return rows
}

// Where the outbox's next walk starts: back to a transaction that ended or
// a batch that rolled back, first; then from the oldest row when that walk
// is due; then from where safe was a lease (and a recheck period) ago, when
// a recheck is due; else from next.
func TestFreshFloorStart(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	lease := time.Minute
	for _, tc := range []struct {
		name        string
		back        int64
		sinceFull   time.Duration
		sinceCheck  time.Duration
		recheckTook time.Duration
		want        freshWalk
	}{
		{"next", -1, time.Second, 100 * time.Millisecond, 0, freshWalk{from: 900}},
		{"back to an ended transaction", 300, time.Hour, time.Hour, 0, freshWalk{from: 300}},
		{"the oldest row, every fullWalkEvery", -1, fullWalkEvery, 0, 0, freshWalk{from: 0, full: true}},
		{"a recheck from safe a lease and a poll ago", -1, time.Second, time.Second, 0, freshWalk{from: 500, recheck: true}},
		{"an expensive recheck waits recheckShare times what it took", -1, time.Second, 1500 * time.Millisecond, 20 * time.Millisecond, freshWalk{from: 900}},
		{"...then runs, from safe a lease and its period ago", -1, time.Second, 2 * time.Second, 20 * time.Millisecond, freshWalk{from: 400, recheck: true}},
	} {
		f := newFreshFloor(time.Second, lease, t0.Add(-time.Hour))
		f.next, f.safe, f.back = 900, 900, tc.back
		f.marks = []floorMark{
			{at: t0.Add(-time.Hour), safe: 0},
			{at: t0.Add(-lease - 3*time.Second), safe: 400},
			{at: t0.Add(-lease - time.Second), safe: 500},
			{at: t0.Add(-time.Second), safe: 800},
		}
		f.lastFull, f.lastRecheck, f.recheckTook = t0.Add(-tc.sinceFull), t0.Add(-tc.sinceCheck), tc.recheckTook
		if got := f.start(t0); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// advance after a claim of the outbox. A short walk from at or below safe
// raises safe to its top, remembering each transaction running at its
// snapshot from the old safe; a transaction seen ended is forgotten if the
// walk started at or below where its rows may start, else walked back to.
// A full walk moves next on to its top, or down to it from below the mark.
func TestFreshFloorAdvance(t *testing.T) {
	t.Parallel()
	type state struct {
		next, safe, back int64
		pending          map[int64]int64
	}
	for _, tc := range []struct {
		name   string
		before state
		rows   []*claimed
		from   int64
		full   bool
		snap   snapshot
		want   state
	}{
		{"a short walk raises safe, remembering the running transactions",
			state{next: 50, safe: 50, back: -1, pending: map[int64]int64{}},
			fresh(60, 70), 50, false, snapshot{xmin: 5, xmax: 9, xip: []int64{5, 7}},
			state{next: 70, safe: 70, back: -1, pending: map[int64]int64{5: 50, 7: 50}}},
		{"a transaction already remembered keeps where its rows may start",
			state{next: 70, safe: 70, back: -1, pending: map[int64]int64{5: 50}},
			fresh(80), 70, false, snapshot{xmin: 5, xmax: 9, xip: []int64{5}},
			state{next: 80, safe: 80, back: -1, pending: map[int64]int64{5: 50}}},
		{"ended, and its rows were in this walk: forgotten",
			state{next: 80, safe: 80, back: -1, pending: map[int64]int64{5: 80}},
			nil, 80, false, snapshot{xmin: 9, xmax: 9},
			state{next: 80, safe: 80, back: -1, pending: map[int64]int64{}}},
		{"ended below this walk: the next walks back to its rows",
			state{next: 80, safe: 80, back: -1, pending: map[int64]int64{5: 50, 6: 60}},
			fresh(90), 80, false, snapshot{xmin: 6, xmax: 9, xip: []int64{6}},
			state{next: 90, safe: 90, back: 50, pending: map[int64]int64{5: 50, 6: 60}}},
		{"the walk back forgets it and raises safe",
			state{next: 90, safe: 90, back: 50, pending: map[int64]int64{5: 50, 6: 60}},
			fresh(55, 95), 50, false, snapshot{xmin: 6, xmax: 9, xip: []int64{6}},
			state{next: 95, safe: 95, back: -1, pending: map[int64]int64{6: 60}}},
		{"a transaction still running stays",
			state{next: 90, safe: 90, back: -1, pending: map[int64]int64{5: 50}},
			nil, 90, false, snapshot{xmin: 5, xmax: 12, xip: []int64{5, 11}},
			state{next: 90, safe: 90, back: -1, pending: map[int64]int64{5: 50}}},
		{"a full walk from next moves next on",
			state{next: 100, safe: 50, back: -1, pending: map[int64]int64{}},
			fresh(101, 102, 103), 100, true, snapshot{xmin: 5, xmax: 6},
			state{next: 103, safe: 50, back: -1, pending: map[int64]int64{}}},
		{"a full walk from below next goes on from its top",
			state{next: 500, safe: 400, back: -1, pending: map[int64]int64{}},
			fresh(10, 11, 12), 0, true, snapshot{xmin: 5, xmax: 6},
			state{next: 12, safe: 400, back: -1, pending: map[int64]int64{}}},
		{"a full walk from below next that took none of the outbox's rows goes on from its start",
			state{next: 500, safe: 400, back: -1, pending: map[int64]int64{}},
			unkeyed(10, 11, 12), 300, true, snapshot{xmin: 5, xmax: 6},
			state{next: 300, safe: 400, back: -1, pending: map[int64]int64{}}},
		{"a short walk above safe raises nothing, and the next walks from safe",
			state{next: 90, safe: 50, back: -1, pending: map[int64]int64{}},
			fresh(95), 90, false, snapshot{xmin: 100, xmax: 101},
			state{next: 50, safe: 50, back: -1, pending: map[int64]int64{}}},
		{"keyed rows and the owed table's do not count",
			state{next: 50, safe: 50, back: -1, pending: map[int64]int64{}},
			append(unkeyed(99), &claimed{msg: Message{ID: 98, HasKey: true}, fresh: true}), 50, false, snapshot{xmin: 5, xmax: 6},
			state{next: 50, safe: 50, back: -1, pending: map[int64]int64{}}},
	} {
		f := newFreshFloor(time.Second, time.Minute, time.Unix(0, 0))
		f.next, f.safe, f.back, f.pending = tc.before.next, tc.before.safe, tc.before.back, tc.before.pending
		f.advance(tc.rows, freshWalk{from: tc.from}, tc.snap, tc.full, time.Unix(10, 0), time.Millisecond)
		got := state{f.next, f.safe, f.back, f.pending}
		if got.next != tc.want.next || got.safe != tc.want.safe || got.back != tc.want.back || !maps.Equal(got.pending, tc.want.pending) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// With more transactions running than it may remember, the floor waits, as
// if none of its walks had come back short.
func TestFreshFloorBoundsPending(t *testing.T) {
	t.Parallel()
	f := newFreshFloor(time.Second, time.Minute, time.Unix(0, 0))
	xip := make([]int64, maxPending+1)
	for i := range xip {
		xip[i] = int64(i + 10)
	}
	f.advance(fresh(5), freshWalk{}, snapshot{xmin: 10, xmax: int64(maxPending + 20), xip: xip}, false, time.Unix(1, 0), 0)
	if f.safe != 0 || len(f.pending) != 0 {
		t.Fatalf("safe %d with %d transactions remembered, want 0 and none", f.safe, len(f.pending))
	}
}

// A batch of this relay's that rolled back: the next walk starts at its
// lowest row, and the backlog figures from there, not from where an open
// transaction's rows may start.
func TestFreshFloorWalkBack(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newFreshFloor(time.Second, time.Minute, now)
	f.next, f.safe = 900, 900
	f.walkBack(700)
	f.walkBack(800)
	if w := f.start(now); w.from != 700 {
		t.Fatalf("walk from %d, want 700", w.from)
	}
	if low := f.lowest(now); low != 0 {
		t.Fatalf("lowest %d, want 0: safe was 0 a lease ago", low)
	}
	f.marks = []floorMark{{at: now.Add(-2 * time.Minute), safe: 850}}
	if low := f.lowest(now); low != 700 {
		t.Fatalf("lowest %d, want the walk back's 700", low)
	}
	// A transaction still open leaves its rows out: no read sees them yet.
	f.pending[42] = 100
	if low := f.lowest(now); low != 700 {
		t.Fatalf("lowest %d with a transaction open from 100, want still 700", low)
	}
}

// Marks keep safe as it was, one per markEvery, and only as far back as a
// recheck may still start.
func TestFreshFloorMarks(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(0, 0)
	f := newFreshFloor(time.Second, time.Minute, t0)
	top := int64(0)
	for i := range 3000 { // 5 minutes of short walks, 10 a second
		now := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		top += 10
		f.advance(fresh(top), freshWalk{from: f.safe}, snapshot{xmin: 1, xmax: 1}, false, now, 0)
	}
	now := t0.Add(300 * time.Second)
	if n := len(f.marks); n > 1300 {
		t.Errorf("%d marks kept, want those of the last lease, recheck and minute (about 1,200)", n)
	}
	if got := f.markBefore(now.Add(-f.lease)); got < 23_000 || got > 24_100 {
		t.Errorf("safe a lease ago: %d, want about 24,000", got)
	}
}

// A recheck's cost is what it takes past an ordinary claim: on a busy
// machine both are slow, and the recheck still runs every poll; one that
// walks a held horizon's dead rows waits recheckShare times its extra.
func TestFreshFloorRecheckCostIsWhatItAdds(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name           string
		claim, recheck time.Duration
		wantEvery      time.Duration
	}{
		{"as slow as an ordinary claim", 40 * time.Millisecond, 45 * time.Millisecond, time.Second},
		{"a walk over dead rows", 40 * time.Millisecond, 140 * time.Millisecond, 100 * 100 * time.Millisecond},
	} {
		f := newFreshFloor(time.Second, time.Minute, now)
		f.advance(fresh(5), freshWalk{from: f.next}, snapshot{}, false, now, tc.claim)
		f.advance(nil, freshWalk{from: 0, recheck: true}, snapshot{}, false, now, tc.recheck)
		if got := f.recheckEvery(); got != tc.wantEvery {
			t.Errorf("%s: a recheck every %v, want %v", tc.name, got, tc.wantEvery)
		}
	}
}
