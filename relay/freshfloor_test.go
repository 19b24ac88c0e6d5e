package relay

import (
	"maps"
	"reflect"
	"slices"
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

// An ordinary claim walks from next, or from below it to the gaps within
// foldSpan of it.
func TestFreshFloorStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		gaps []span
		want int64
	}{
		{"no gap: next", nil, 9000},
		{"a near gap", []span{{8000, 9000}, {6000, 7000}}, 6000},
		{"a far gap is a sweep's", []span{{4000, 8000}, {8500, 9000}}, 8500},
	} {
		f := newFreshFloor(time.Second, time.Unix(0, 0))
		f.next, f.safe, f.gaps = 9000, 9000, tc.gaps
		if got := f.start(); got.from != tc.want || got.belowFloor {
			t.Errorf("%s: %+v, want from %d, unbounded, not a sweep", tc.name, got, tc.want)
		}
	}
}

// A sweep, one at a time, ends where the ordinary claims start, and takes
// the gaps it covers: from the oldest row every fullWalkEvery; else the
// lowest far gap with those it overlaps, sweepSpan ids at most; else a
// recheck, of the rows from where the last one ended and those it saw
// held, every poll while it is cheap.
func TestFreshFloorSweeps(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	near := span{8800, 9000}
	for _, tc := range []struct {
		name        string
		gaps        []span
		sinceFull   time.Duration
		sinceCheck  time.Duration
		recheckTook time.Duration
		inFlight    bool
		want        freshWalk
		none        bool
		left        []span
	}{
		{"none due", []span{near}, time.Second, 100 * time.Millisecond, 0, false, freshWalk{}, true, []span{near}},
		{"one in flight", []span{{100, 200}}, time.Hour, time.Hour, 0, true, freshWalk{}, true, []span{{100, 200}}},
		{"the oldest row, every fullWalkEvery", []span{{100, 200}, near}, fullWalkEvery, 0, 0, false,
			freshWalk{from: 0, to: 9000, belowFloor: true, fromOldest: true, gaps: []span{{100, 200}, near}}, false, nil},
		{"the lowest far gap and those it overlaps", []span{near, {3000, 5000}, {100, 2000}, {1500, 2500}}, time.Second, 0, 0, false,
			freshWalk{from: 100, to: 2500, belowFloor: true, gaps: []span{{100, 2000}, {1500, 2500}}}, false, []span{{3000, 5000}, near}},
		{"at most sweepSpan ids of a gap; the rest stays", []span{{100, 100 + 3*sweepSpan}}, time.Second, 0, 0, false,
			freshWalk{from: 100, to: 100 + sweepSpan, belowFloor: true, gaps: []span{{100, 100 + sweepSpan}}}, false,
			[]span{{100 + sweepSpan, 100 + 3*sweepSpan}}},
		{"a recheck from where the last ended, and the rows it saw held", []span{near}, time.Second, time.Second, 0, false,
			freshWalk{from: 8500, to: 9000, belowFloor: true, recheck: true, ids: []int64{300, 8200}, gaps: []span{near}}, false, nil},
		{"an expensive recheck waits recheckShare times what it took", nil, time.Second, 1500 * time.Millisecond, 20 * time.Millisecond, false,
			freshWalk{}, true, nil},
		{"...then runs", nil, time.Second, 2 * time.Second, 20 * time.Millisecond, false,
			freshWalk{from: 8500, to: 9000, belowFloor: true, recheck: true, ids: []int64{300, 8200}}, false, nil},
	} {
		f := newFreshFloor(time.Second, t0.Add(-time.Hour))
		f.next, f.safe, f.gaps = 9000, 9000, slices.Clone(tc.gaps)
		if tc.inFlight {
			f.sweeping = &freshWalk{}
		}
		f.rechecked, f.held = 8500, []int64{300, 8200}
		f.lastFromOldest, f.lastRecheck, f.recheckTook = t0.Add(-tc.sinceFull), t0.Add(-tc.sinceCheck), tc.recheckTook
		due := f.sweepDue(t0)
		got, ok := f.startSweep(t0)
		switch {
		case due != ok:
			t.Errorf("%s: sweepDue %v, but startSweep %v", tc.name, due, ok)
		case ok == tc.none:
			t.Errorf("%s: sweep %v, want %v", tc.name, ok, !tc.none)
		case ok && !reflect.DeepEqual(got, tc.want):
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if !slices.Equal(f.gaps, tc.left) && len(f.gaps)+len(tc.left) > 0 {
			t.Errorf("%s: gaps left %v, want %v", tc.name, f.gaps, tc.left)
		}
	}
}

// A sweep that came back full leaves the rest of its walk as a gap; one
// that failed gives its gaps back; either way the next may start.
func TestFreshFloorSweepEnds(t *testing.T) {
	t.Parallel()
	f := newFreshFloor(time.Second, time.Unix(0, 0))
	f.next, f.safe, f.gaps = 9000, 9000, []span{{100, 200}, {300, 400}}
	w, ok := f.startSweep(time.Unix(1, 0))
	if !ok || w.from != 100 || w.to != 200 {
		t.Fatalf("sweep %v %+v, want the gap (100, 200]", ok, w)
	}
	f.swept(fresh(150, 160), w, snapshot{}, true, time.Millisecond)
	if want := []span{{300, 400}, {160, 200}}; !slices.Equal(f.gaps, want) || f.sweeping != nil {
		t.Fatalf("after a full sweep: gaps %v (in flight %v), want %v", f.gaps, f.sweeping != nil, want)
	}
	w, _ = f.startSweep(time.Unix(1, 0))
	f.unsweep(w)
	if want := []span{{300, 400}, {160, 200}}; !slices.Equal(f.gaps, want) || f.sweeping != nil {
		t.Fatalf("after a failed sweep: gaps %v (in flight %v), want %v", f.gaps, f.sweeping != nil, want)
	}
	w, _ = f.startSweep(time.Unix(1, 0))
	f.swept(nil, w, snapshot{}, false, time.Millisecond)
	if want := []span{{300, 400}}; !slices.Equal(f.gaps, want) {
		t.Fatalf("after a short sweep: gaps %v, want %v", f.gaps, want)
	}
}

// advance after an ordinary claim of the outbox. A short walk from at or
// below safe raises safe to its top, remembering each transaction running
// at its snapshot from the old safe; a transaction seen ended is forgotten,
// leaving a gap if its rows may start below the walk's. A walk takes the
// gaps from its start on. A full walk moves next on to its top, or down to
// it from below the mark.
func TestFreshFloorAdvance(t *testing.T) {
	t.Parallel()
	type state struct {
		next, safe int64
		gaps       []span
		pending    map[int64]int64
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
			state{next: 50, safe: 50, pending: map[int64]int64{}},
			fresh(60, 70), 50, false, snapshot{xmin: 5, xmax: 9, xid: 9, xip: []int64{5, 7}},
			state{next: 70, safe: 70, pending: map[int64]int64{5: 50, 7: 50}}},
		{"a transaction already remembered keeps where its rows may start",
			state{next: 70, safe: 70, pending: map[int64]int64{5: 50}},
			fresh(80), 70, false, snapshot{xmin: 5, xmax: 9, xid: 9, xip: []int64{5}},
			state{next: 80, safe: 80, pending: map[int64]int64{5: 50}}},
		{"ended, and its rows were in this walk: forgotten",
			state{next: 80, safe: 80, pending: map[int64]int64{5: 80}},
			nil, 80, false, snapshot{xmin: 9, xmax: 9, xid: 9},
			state{next: 80, safe: 80, pending: map[int64]int64{}}},
		{"ended below this walk: forgotten, its rows below it a gap",
			state{next: 80, safe: 80, pending: map[int64]int64{5: 50, 6: 60}},
			fresh(90), 80, false, snapshot{xmin: 6, xmax: 9, xid: 9, xip: []int64{6}},
			state{next: 90, safe: 90, gaps: []span{{50, 80}}, pending: map[int64]int64{6: 60}}},
		{"a walk from a gap takes it and those above, and raises safe",
			state{next: 90, safe: 90, gaps: []span{{20, 30}, {50, 80}, {85, 90}}, pending: map[int64]int64{6: 60}},
			fresh(55, 95), 50, false, snapshot{xmin: 6, xmax: 9, xid: 9, xip: []int64{6}},
			state{next: 95, safe: 95, gaps: []span{{20, 30}}, pending: map[int64]int64{6: 60}}},
		{"a walk from a gap remembers the transactions running from safe: below it their rows are remembered already",
			state{next: 90, safe: 90, gaps: []span{{50, 80}}, pending: map[int64]int64{}},
			fresh(95), 50, false, snapshot{xmin: 7, xmax: 9, xid: 9, xip: []int64{7}},
			state{next: 95, safe: 95, pending: map[int64]int64{7: 90}}},
		{"a transaction still running stays",
			state{next: 90, safe: 90, pending: map[int64]int64{5: 50}},
			nil, 90, false, snapshot{xmin: 5, xmax: 12, xid: 12, xip: []int64{5, 11}},
			state{next: 90, safe: 90, pending: map[int64]int64{5: 50}}},
		{"a full walk from safe raises it too",
			state{next: 50, safe: 50, pending: map[int64]int64{}},
			fresh(60, 70, 80), 50, true, snapshot{xmin: 5, xmax: 9, xid: 9, xip: []int64{5}},
			state{next: 80, safe: 80, pending: map[int64]int64{5: 50}}},
		{"a full walk from next moves next on",
			state{next: 100, safe: 50, pending: map[int64]int64{}},
			fresh(101, 102, 103), 100, true, snapshot{xmin: 5, xmax: 6, xid: 6},
			state{next: 103, safe: 50, pending: map[int64]int64{}}},
		{"a full walk from below next goes on from its top",
			state{next: 500, safe: 400, gaps: []span{{5, 500}}, pending: map[int64]int64{}},
			fresh(10, 11, 12), 5, true, snapshot{xmin: 5, xmax: 6, xid: 6},
			state{next: 12, safe: 400, pending: map[int64]int64{}}},
		{"a full walk from below next that took none of the outbox's rows goes on from its start",
			state{next: 500, safe: 400, gaps: []span{{300, 500}}, pending: map[int64]int64{}},
			unkeyed(10, 11, 12), 300, true, snapshot{xmin: 5, xmax: 6, xid: 6},
			state{next: 300, safe: 400, pending: map[int64]int64{}}},
		{"a short walk above safe raises nothing, and the next walks from safe",
			state{next: 90, safe: 50, pending: map[int64]int64{}},
			fresh(95), 90, false, snapshot{xmin: 100, xmax: 101, xid: 101},
			state{next: 50, safe: 50, pending: map[int64]int64{}}},
		{"keyed rows and the owed table's do not count",
			state{next: 50, safe: 50, pending: map[int64]int64{}},
			append(unkeyed(99), &claimed{msg: Message{ID: 98, HasKey: true}, fresh: true}), 50, false, snapshot{xmin: 5, xmax: 6, xid: 6},
			state{next: 50, safe: 50, pending: map[int64]int64{}}},
	} {
		f := newFreshFloor(time.Second, time.Unix(0, 0))
		f.next, f.safe, f.gaps, f.pending = tc.before.next, tc.before.safe, tc.before.gaps, tc.before.pending
		f.advance(tc.rows, freshWalk{from: tc.from}, tc.snap, tc.full, time.Millisecond)
		got := state{f.next, f.safe, f.gaps, f.pending}
		if got.next != tc.want.next || got.safe != tc.want.safe || !slices.Equal(got.gaps, tc.want.gaps) || !maps.Equal(got.pending, tc.want.pending) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// With more transactions running than it may remember, the floor waits, as
// if none of its walks had come back short.
func TestFreshFloorBoundsPending(t *testing.T) {
	t.Parallel()
	f := newFreshFloor(time.Second, time.Unix(0, 0))
	xip := make([]int64, maxPending+1)
	for i := range xip {
		xip[i] = int64(i + 10)
	}
	f.advance(fresh(5), freshWalk{}, snapshot{xmin: 10, xmax: int64(maxPending + 20), xid: int64(maxPending + 20), xip: xip}, false, 0)
	if f.safe != 0 || len(f.pending) != 0 {
		t.Fatalf("safe %d with %d transactions remembered, want 0 and none", f.safe, len(f.pending))
	}
}

// A batch of this relay's that rolled back leaves a gap from its lowest
// row: the next claim takes that row and those after it, and the backlog
// figures start there, not where an open transaction's rows may start.
func TestFreshFloorWalkBack(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newFreshFloor(time.Second, now)
	f.next, f.safe = 900, 900
	f.walkBack(700)
	f.walkBack(800)
	f.walkBack(950) // above next: the next claim walks it anyway
	if w := f.start(); w.from != 699 {
		t.Fatalf("walk from %d, want 699: row 700 is the batch's lowest", w.from)
	}
	if low := f.lowest(); low != 0 {
		t.Fatalf("lowest %d, want 0: no recheck yet", low)
	}
	f.rechecked = 850
	if low := f.lowest(); low != 699 {
		t.Fatalf("lowest %d, want the gap's 699", low)
	}
	// A transaction still open leaves its rows out: no read sees them yet.
	f.pending[42] = 100
	if low := f.lowest(); low != 699 {
		t.Fatalf("lowest %d with a transaction open from 100, want still 699", low)
	}
	// ...and so does a sweep in flight over the gap.
	f.next = 9000
	if w, ok := f.startSweep(now); !ok || w.from != 699 {
		t.Fatalf("sweep %v from %d, want the gap's 699", ok, w.from)
	}
	if low := f.lowest(); low != 699 {
		t.Fatalf("lowest %d with the gap in a sweep, want still 699", low)
	}
}

// A recheck goes on from where it ended, and walks again the rows it saw
// and did not take (held by other batches); they count in the backlog
// figures until then. It remembers the transactions running at its
// snapshot from safe, as a raise of safe does: their rows may be among those
// it passed above safe. With more than maxHeld rows held it walks its rows
// again instead.
func TestFreshFloorRecheck(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newFreshFloor(time.Second, now)
	f.next, f.safe = 9000, 8000
	w, ok := f.startSweep(now.Add(time.Second))
	if !ok || !w.recheck || w.from != 0 || w.to != 9000 {
		t.Fatalf("sweep %v %+v, want a recheck of (0, 9000]", ok, w)
	}
	f.swept(fresh(10), w, snapshot{xmin: 5, xmax: 9, xid: 9, xip: []int64{5}, left: []int64{20, 8000}}, false, time.Millisecond)
	if f.rechecked != 9000 || !slices.Equal(f.held, []int64{20, 8000}) || f.lowest() != 20 || !maps.Equal(f.pending, map[int64]int64{5: 8000}) {
		t.Fatalf("rechecked %d, held %v, lowest %d, pending %v; want 9000, [20 8000], 20, map[5:8000]", f.rechecked, f.held, f.lowest(), f.pending)
	}
	f.safe, f.next = 9500, 9500
	w, _ = f.startSweep(now.Add(2 * time.Second))
	if w.from != 9000 || w.to != 9500 || !slices.Equal(w.ids, []int64{20, 8000}) {
		t.Fatalf("recheck %+v, want (9000, 9500] and the rows 20, 8000", w)
	}
	f.swept(nil, w, snapshot{left: make([]int64, maxHeld+1)}, false, time.Millisecond)
	if f.rechecked != 9000 || !slices.Equal(f.held, []int64{20, 8000}) {
		t.Fatalf("after a recheck that saw too many rows held: rechecked %d, held %v; want 9000, [20 8000]", f.rechecked, f.held)
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
		f := newFreshFloor(time.Second, now)
		f.advance(fresh(5), freshWalk{from: f.next}, snapshot{}, false, tc.claim)
		f.swept(nil, freshWalk{from: 0, belowFloor: true, recheck: true}, snapshot{}, false, tc.recheck)
		if got := f.recheckEvery(); got != tc.wantEvery {
			t.Errorf("%s: a recheck every %v, want %v", tc.name, got, tc.wantEvery)
		}
	}
}

// movable, where the outbox's rows may still move to the owed table from,
// is the lowest of where the claims start and the gaps; lowest, where the
// backlog figures start, also waits for the recheck.
func TestFreshFloorMovable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		next, safe, recheck  int64
		held                 []int64
		gaps, sweeping       []span
		wantMovable, wantLow int64
	}{
		{"the claims' start", 500, 500, 500, nil, nil, nil, 500, 500},
		{"safe below next", 600, 500, 600, nil, nil, nil, 500, 500},
		{"a gap", 500, 500, 500, nil, []span{{300, 400}}, nil, 300, 300},
		{"a sweep's gap", 500, 500, 500, nil, nil, []span{{200, 250}}, 200, 200},
		{"the recheck behind: not movable's", 500, 500, 100, []int64{50}, nil, nil, 500, 50},
	} {
		f := newFreshFloor(time.Second, time.Unix(0, 0))
		f.next, f.safe, f.rechecked, f.held, f.gaps = tc.next, tc.safe, tc.recheck, tc.held, tc.gaps
		if tc.sweeping != nil {
			f.sweeping = &freshWalk{gaps: tc.sweeping}
		}
		if got, low := f.movable(), f.lowest(); got != tc.wantMovable || low != tc.wantLow {
			t.Errorf("%s: movable %d lowest %d, want %d %d", tc.name, got, low, tc.wantMovable, tc.wantLow)
		}
	}
}

// A near gap's walk may pass rows another relay's batch holds there: the
// recheck walks from the gap's start again, and one in flight when the walk
// ran does not go past it.
func TestFreshFloorGapWalkSendsTheRecheckBack(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newFreshFloor(time.Second, now)
	f.next, f.safe, f.rechecked = 9000, 9000, 8800
	w, ok := f.startSweep(now.Add(time.Second))
	if !ok || !w.recheck || w.from != 8800 {
		t.Fatalf("sweep %v %+v, want a recheck from 8800", ok, w)
	}
	f.gaps = []span{{8500, 8900}}
	f.advance(fresh(9010), f.start(), snapshot{xmin: 9, xmax: 9, xid: 9}, false, time.Millisecond)
	if f.rechecked != 8500 {
		t.Fatalf("rechecked %d after a walk from the gap at 8500, want 8500", f.rechecked)
	}
	f.swept(nil, w, snapshot{xmin: 9, xmax: 9, xid: 9}, false, time.Millisecond)
	if f.rechecked != 8500 {
		t.Fatalf("rechecked %d after the recheck in flight ended, want still 8500", f.rechecked)
	}
	w, _ = f.startSweep(now.Add(2 * time.Second))
	if w.from != 8500 {
		t.Fatalf("the next recheck walks from %d, want 8500", w.from)
	}
	f.swept(nil, w, snapshot{xmin: 9, xmax: 9, xid: 9}, false, time.Millisecond)
	if f.rechecked != w.to {
		t.Fatalf("rechecked %d, want the recheck's end %d", f.rechecked, w.to)
	}
}

// While every claim sees a transaction running that has ended by the next
// one (several relays, busy producers), the floor rises: a walk from the gap
// an ended one left does not remember the new ones from that gap's start.
func TestFreshFloorRisesWhileEveryClaimSeesATransactionEnd(t *testing.T) {
	t.Parallel()
	f := newFreshFloor(time.Second, time.Unix(0, 0))
	f.next, f.safe = 100, 100
	top, x := int64(100), int64(20)
	var froms []int64
	for range 10 {
		w := f.start()
		froms = append(froms, w.from)
		top += 10
		f.advance(fresh(top), w, snapshot{xmin: x, xmax: x + 1, xid: x + 1, xip: []int64{x}}, false, time.Millisecond)
		x += 2
	}
	if low := f.movable(); low < top-20 {
		t.Fatalf("movable %d after 10 claims up to row %d, want within two claims of it (walks from %v)", low, top, froms)
	}
	if froms[len(froms)-1] < top-30 {
		t.Fatalf("the last claim walked from %d, up to row %d: want within two claims of it (walks from %v)", froms[len(froms)-1], top, froms)
	}
}

// A sweep other than the recheck hands the rows it saw held by other batches
// to the recheck, which walks them again; with more than maxHeld, the
// recheck walks again from the sweep's start.
func TestFreshFloorSweepHandsHeldRowsToTheRecheck(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newFreshFloor(time.Hour, now)
	f.next, f.safe, f.rechecked, f.held = 9000, 9000, 8900, []int64{40, 8950}
	f.gaps = []span{{100, 200}}
	w, ok := f.startSweep(now)
	if !ok || w.recheck || w.from != 100 {
		t.Fatalf("sweep %v %+v, want the far gap from 100", ok, w)
	}
	f.swept(fresh(110), w, snapshot{left: []int64{150, 170}}, false, time.Millisecond)
	if want := []int64{40, 150, 170, 8950}; !slices.Equal(f.held, want) || f.rechecked != 8900 {
		t.Fatalf("held %v, rechecked %d; want %v, 8900", f.held, f.rechecked, want)
	}
	f.lastRecheck = time.Time{}
	if w, _ := f.startSweep(now); !w.recheck || !slices.Equal(w.ids, f.held) {
		t.Fatalf("the next sweep %+v, want a recheck of the rows held %v", w, f.held)
	}
	f.sweeping = nil
	f.gaps = []span{{300, 400}}
	w, _ = f.startSweep(now)
	f.swept(nil, w, snapshot{left: make([]int64, maxHeld)}, false, time.Millisecond)
	if f.rechecked != 300 || len(f.held) != 4 {
		t.Fatalf("after a sweep that saw more rows held than the recheck keeps: rechecked %d, %d held; want 300, 4", f.rechecked, len(f.held))
	}
}
