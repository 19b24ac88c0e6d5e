package relay

import (
	"math"
	"testing"
	"time"
)

func unkeyed(ids ...int64) []*claimed {
	rows := make([]*claimed, len(ids))
	for i, id := range ids {
		rows[i] = &claimed{msg: Message{ID: id}}
	}
	return rows
}

// The claim floor's start: from the oldest row every PollInterval (every
// quickWalk while that walk is cheap), else from the high-water mark.
func TestClaimFloorStart(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name      string
		cheap     bool
		lastWalk  time.Duration // before now
		highWater int64
		want      int64
	}{
		{"first claim walks from the oldest row", false, 1000 * time.Second, 50, 0},
		{"within PollInterval: the mark", false, 500 * time.Millisecond, 50, 50},
		{"PollInterval passed: the oldest row", false, time.Second, 50, 0},
		{"cheap walk, quickWalk passed: the oldest row", true, 100 * time.Millisecond, 50, 0},
		{"cheap walk, within quickWalk: the mark", true, 50 * time.Millisecond, 50, 50},
		{"not cheap, quickWalk passed: the mark", false, 100 * time.Millisecond, 50, 50},
	} {
		f := newClaimFloor(10, time.Second)
		f.oldestWalkCheap, f.highWater = tc.cheap, tc.highWater
		f.lastOldestWalk = t0.Add(-tc.lastWalk).UnixNano()
		if got := f.start(t0); got != tc.want {
			t.Errorf("%s: start %d, want %d", tc.name, got, tc.want)
		}
		if tc.want == 0 && f.lastOldestWalk != t0.UnixNano() {
			t.Errorf("%s: a walk from the oldest row not noted", tc.name)
		}
	}
}

// advance after a claim: full claims move the high-water mark; safe rises
// to just below the lowest row still owed the claim saw, or to where the
// outbox's rows may still start; a short claim sends the mark there.
func TestClaimFloorAdvance(t *testing.T) {
	t.Parallel()
	type state struct{ highWater, safe int64 }
	for _, tc := range []struct {
		name   string
		before state
		rows   []*claimed
		floor  int64
		fresh  int64 // the outbox's lowest row that may still move to the owed table
		snap   snapshot
		want   state
	}{
		{"full claim from 0 lowers the mark to its top",
			state{highWater: 500, safe: 400}, unkeyed(10, 11, 12), 0, 900, snapshot{owedLow: 10},
			state{highWater: 12, safe: 9}},
		{"full claim from the mark raises it",
			state{highWater: 100, safe: 50}, unkeyed(101, 102, 103), 100, 900, snapshot{owedLow: 60},
			state{highWater: 103, safe: 59}},
		{"full claim below the mark keeps it",
			state{highWater: 200, safe: 50}, unkeyed(101, 102, 103), 100, 900, snapshot{owedLow: 60},
			state{highWater: 200, safe: 59}},
		{"short claim, rows still owed: below the lowest",
			state{highWater: 90, safe: 50}, unkeyed(60, 70), 50, 900, snapshot{owedLow: 60},
			state{highWater: 59, safe: 59}},
		{"short claim, nothing owed: to where the outbox's rows may start",
			state{highWater: 90, safe: 50}, unkeyed(60, 70), 50, 900, snapshot{},
			state{highWater: 900, safe: 900}},
		{"past a long transaction: its xid is not waited for",
			state{highWater: 50, safe: 50}, nil, 50, 900, snapshot{xmin: 5, xmax: 90, xip: []int64{5}},
			state{highWater: 900, safe: 900}},
		{"the outbox's rows may start lower: safe follows them down",
			state{highWater: 500, safe: 500}, nil, 500, 300, snapshot{},
			state{highWater: 300, safe: 300}},
	} {
		f := newClaimFloor(3, time.Second)
		f.highWater, f.safe = tc.before.highWater, tc.before.safe
		f.fresh.next, f.fresh.rechecked = tc.fresh, tc.fresh
		f.advance(tc.rows, tc.floor, tc.snap, time.Millisecond)
		if got := (state{f.highWater, f.safe}); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// The owed table's floors in what begin hands a claim: the walk from the
// oldest row probes from there, keyed walks too; a sweep walks none of it.
func TestClaimFloorOwedFloors(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newClaimFloor(10, time.Hour)
	f.lastOldestWalk, f.highWater, f.safe, f.keyed.owed = now.UnixNano(), 70, 60, 40
	fl := f.begin(now)
	f.end(fl, true)
	if fl.owed != 70 || fl.owedSafe != 60 || fl.owedKeyed != 40 {
		t.Errorf("ordinary claim: owed %d safe %d keyed %d, want 70 60 40", fl.owed, fl.owedSafe, fl.owedKeyed)
	}
	f.lastOldestWalk = now.Add(-time.Hour).UnixNano()
	fl = f.begin(now)
	f.end(fl, true)
	if fl.owed != 0 || fl.owedSafe != 0 || fl.owedKeyed != 0 {
		t.Errorf("walk from the oldest row: owed %d safe %d keyed %d, want 0 0 0", fl.owed, fl.owedSafe, fl.owedKeyed)
	}
	f.fresh.gaps = []span{{1, 2}} // far below next: a sweep
	f.fresh.next = 1 << 20
	fl = f.begin(now)
	f.end(fl, false)
	if !fl.fresh.belowFloor || fl.owed != math.MaxInt64 || fl.owedSafe != math.MaxInt64 || fl.owedKeyed != math.MaxInt64 {
		t.Errorf("sweep %+v: want the owed table's walks and probes past every row", fl)
	}

	// A batch that moved the outbox's rows to the owed table below safe
	// sends the owed walks back to them.
	f.highWater, f.safe = 500, 400
	f.movedToOwed(120)
	if f.safe != 119 || f.highWater != 119 {
		t.Errorf("after rows moved from 120: safe %d mark %d, want 119 119", f.safe, f.highWater)
	}
	f.movedToOwed(450)
	if f.safe != 119 {
		t.Errorf("rows moved above safe lowered it to %d", f.safe)
	}
}

// Keyed rows do not move the floor: the floor places the unkeyed walks.
func TestClaimFloorIgnoresKeyedRows(t *testing.T) {
	t.Parallel()
	f := newClaimFloor(2, time.Second)
	f.highWater = 10
	f.advance([]*claimed{{msg: Message{ID: 11}}, {msg: Message{ID: 99, HasKey: true}}}, 10, snapshot{}, 0)
	if f.highWater != 11 {
		t.Fatalf("high-water mark %d after a full claim of unkeyed 11 and keyed 99, want 11", f.highWater)
	}
}

// A walk from the oldest row counts as cheap when it came back short
// within cheapTook; only walks from the oldest row say so.
func TestClaimFloorCheapWalk(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		rows  []*claimed
		floor int64
		took  time.Duration
		was   bool
		want  bool
	}{
		{"short and quick", unkeyed(1), 0, time.Millisecond, false, true},
		{"short but slow", unkeyed(1), 0, time.Second, true, false},
		{"full", unkeyed(1, 2), 0, time.Millisecond, true, false},
		{"from the mark: unchanged", unkeyed(1), 5, time.Second, true, true},
	} {
		f := newClaimFloor(2, time.Second)
		f.oldestWalkCheap = tc.was
		f.advance(tc.rows, tc.floor, snapshot{}, tc.took)
		if f.oldestWalkCheap != tc.want {
			t.Errorf("%s: cheap %v, want %v", tc.name, f.oldestWalkCheap, tc.want)
		}
	}
}

// An ordinary claim whose snapshot's xmax is below the one before it sees
// another history (a standby promoted without the last transactions): every
// floor starts again from the oldest rows, and a sweep begun before is
// forgotten, whether it ends claimed or not.
func TestClaimFloorResetsWhenTransactionIDsGoBack(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newClaimFloor(10, time.Hour)
	claim := func(xmax int64, rows ...int64) bool {
		t.Helper()
		fl := f.begin(now)
		defer f.end(fl, true)
		return f.claimed(fresh(rows...), fl, snapshot{xmin: xmax, xmax: xmax}, time.Millisecond)
	}
	if claim(100, 5000) || claim(101, 9000) {
		t.Fatal("a reset with xmax going up")
	}
	f.mu.Lock()
	f.fresh.gaps = []span{{10, 20}} // far below next: a sweep
	f.mu.Unlock()
	sweep := f.begin(now)
	if !sweep.fresh.belowFloor {
		t.Fatalf("%+v, want a sweep", sweep)
	}
	if !claim(50, 30) {
		t.Fatal("no reset with xmax gone back from 101 to 50")
	}
	f.claimed(fresh(15), sweep, snapshot{}, time.Millisecond)
	f.end(sweep, false)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fresh.safe != 0 || f.fresh.next != 0 || f.keyed.floor != 0 || f.highWater != 0 || len(f.fresh.gaps) != 0 || f.fresh.sweeping != nil {
		t.Fatalf("after the reset: fresh safe %d next %d gaps %v sweeping %v, keyed %d, owed %d; want all at the start",
			f.fresh.safe, f.fresh.next, f.fresh.gaps, f.fresh.sweeping != nil, f.keyed.floor, f.highWater)
	}
}
