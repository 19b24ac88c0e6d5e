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

// The owed table's walk from the oldest row runs when asked (a listener
// that reconnected, a phase switched) and as a backstop at least
// fullWalkEvery apart, fullShare times what it took: in the next ordinary
// claim while it is cheap, else as a sweep beside the claims, one at a time.
func TestClaimFloorOldestWalkDue(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name       string
		took       time.Duration // the last walk from the oldest row
		lastWalk   time.Duration // before now
		asked      bool
		walking    bool
		walk, wide bool // a walk from the oldest row; as a sweep
	}{
		{"PollInterval passed, not asked", time.Millisecond, time.Minute, false, false, false, false},
		{"asked, cheap: in the claim", time.Millisecond, 0, true, false, true, false},
		{"asked, slow: a sweep", 50 * time.Millisecond, 0, true, false, true, true},
		{"backstop, cheap: in the claim", time.Millisecond, fullWalkEvery, false, false, true, false},
		{"backstop, slow: a sweep", 50 * time.Millisecond, fullWalkEvery, false, false, true, true},
		{"backstop, slower: fullShare times what it took", 2 * time.Second, fullWalkEvery, false, false, false, false},
		{"asked, a sweep in flight", 50 * time.Millisecond, time.Hour, true, true, false, false},
	} {
		f := newClaimFloor(10, time.Second)
		f.oldestWalkTook, f.oldestWalking = tc.took, tc.walking
		f.lastOldestWalk = t0.Add(-tc.lastWalk)
		f.highWater, f.safe, f.keyed.owed = 70, 60, 40
		if tc.asked {
			f.owedFromOldest()
		}
		due := f.sweepDue(t0)
		fl := f.begin(t0, phase{})
		f.end(fl, true)
		walk := fl.oldest || fl.owed == 0
		if walk != tc.walk || fl.oldest != tc.wide || due != tc.wide {
			t.Errorf("%s: %+v (sweep due %v), want a walk from the oldest row %v, a sweep %v", tc.name, fl, due, tc.walk, tc.wide)
		}
		switch {
		case fl.oldest && (fl.owed != 0 || fl.owedSafe != 0 || fl.owedKeyed != 0 || fl.fresh.from != math.MaxInt64 || fl.keyed != math.MaxInt64 || !fl.beside()):
			t.Errorf("%s: %+v, want the owed table from 0 and no outbox row, beside the claims", tc.name, fl)
		case tc.walk && !fl.oldest && (fl.owedSafe != 0 || fl.owedKeyed != 0 || fl.beside()):
			t.Errorf("%s: %+v, want every owed walk and probe from 0, in the lock", tc.name, fl)
		case !tc.walk && (fl.owed != 70 || fl.owedSafe != 60 || fl.owedKeyed != 40):
			t.Errorf("%s: %+v, want owed 70 safe 60 keyed 40", tc.name, fl)
		}
		if tc.walk && f.oldestWanted {
			t.Errorf("%s: still asked for after the walk began", tc.name)
		}
	}
}

// Floors no claim has moved walk from the oldest row anyway: asking for it
// then costs nothing more.
func TestClaimFloorOldestWalkAskedAtZero(t *testing.T) {
	t.Parallel()
	f := newClaimFloor(10, time.Second)
	f.owedFromOldest()
	if f.oldestWanted {
		t.Error("asked for a walk from the oldest row with every floor at 0")
	}
}

// A walk from the oldest row that fails, in the claim or as a sweep, is
// asked for again.
func TestClaimFloorOldestWalkFailedRunsAgain(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	for _, took := range []time.Duration{time.Millisecond, 50 * time.Millisecond} {
		f := newClaimFloor(10, time.Second)
		f.lastOldestWalk, f.oldestWalkTook, f.highWater = now, took, 70
		f.owedFromOldest()
		fl := f.begin(now, phase{})
		f.end(fl, false)
		if !f.oldestWanted || f.oldestWalking {
			t.Errorf("took %v: after a failed walk from the oldest row: asked %v, in flight %v; want true, false", took, f.oldestWanted, f.oldestWalking)
		}
	}
}

// The walk from the oldest row sends the floors back to the rows still owed
// below them, and notes what it took; a failed one may run again.
func TestClaimFloorWalkedFromOldest(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name                   string
		snap                   snapshot
		safe, highWater, keyed int64
	}{
		{"nothing below the floors", snapshot{owedLow: 700, owedKeyedLow: 900}, 500, 600, 400},
		{"rows put back below them", snapshot{owedLow: 120, owedKeyedLow: 90}, 119, 119, 89},
		{"nothing owed", snapshot{}, 500, 600, 400},
	} {
		f := newClaimFloor(2, time.Second)
		f.safe, f.highWater, f.keyed.owed = 500, 600, 400
		f.lastOldestWalk, f.oldestWalkTook = now.Add(-time.Hour), time.Second
		fl := f.begin(now, phase{})
		if !fl.oldest {
			t.Fatalf("%s: %+v, want a walk from the oldest row", tc.name, fl)
		}
		f.claimed(unkeyed(1), fl, tc.snap, 7*time.Millisecond)
		f.end(fl, true)
		if f.safe != tc.safe || f.highWater != tc.highWater || f.keyed.owed != tc.keyed || f.oldestWalkTook != 7*time.Millisecond || f.oldestWalking {
			t.Errorf("%s: safe %d mark %d keyed %d took %v walking %v; want %d %d %d 7ms false",
				tc.name, f.safe, f.highWater, f.keyed.owed, f.oldestWalkTook, f.oldestWalking, tc.safe, tc.highWater, tc.keyed)
		}
	}
	f := newClaimFloor(2, time.Second)
	f.lastOldestWalk, f.oldestWalkTook = now.Add(-time.Hour), time.Second
	fl := f.begin(now, phase{})
	f.end(fl, false)
	if f.oldestWalking {
		t.Error("a failed walk from the oldest row still in flight")
	}
}

// advance after an ordinary claim: safe rises to just below the lowest row
// still owed the claim saw, or to where the outbox's rows may still move
// from; a full claim moves the high-water mark (from the oldest row: to its
// top), a short one sends it to safe.
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
		{"full claim from 0 sends the mark to its top",
			state{highWater: 500, safe: 400}, unkeyed(10, 11, 12), 0, 900, snapshot{owedLow: 10},
			state{highWater: 12, safe: 9}},
		{"full claim raises the mark",
			state{highWater: 100, safe: 50}, unkeyed(101, 102, 103), 100, 900, snapshot{owedLow: 60},
			state{highWater: 103, safe: 59}},
		{"full claim below the mark keeps it",
			state{highWater: 200, safe: 50}, unkeyed(101, 102, 103), 100, 900, snapshot{owedLow: 60},
			state{highWater: 200, safe: 59}},
		{"short claim, rows still owed: below the lowest",
			state{highWater: 90, safe: 50}, unkeyed(60, 70), 50, 900, snapshot{owedLow: 60},
			state{highWater: 59, safe: 59}},
		{"short claim, nothing owed: to where the outbox's rows may move from",
			state{highWater: 90, safe: 50}, unkeyed(60, 70), 50, 900, snapshot{},
			state{highWater: 900, safe: 900}},
		{"past a long transaction: its xid is not waited for",
			state{highWater: 50, safe: 50}, nil, 50, 900, snapshot{xmin: 5, xmax: 90, xid: 90, xip: []int64{5}},
			state{highWater: 900, safe: 900}},
		{"the outbox's rows may move from lower: safe follows them down",
			state{highWater: 500, safe: 500}, nil, 500, 300, snapshot{},
			state{highWater: 300, safe: 300}},
	} {
		f := newClaimFloor(3, time.Second)
		f.highWater, f.safe = tc.before.highWater, tc.before.safe
		f.fresh.next, f.fresh.safe = tc.fresh, tc.fresh
		f.advance(tc.rows, tc.floor, tc.snap)
		if got := (state{f.highWater, f.safe}); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// What begin hands an ordinary claim: the owed table's floors; a sweep of
// the outbox walks none of the owed table. A batch that moved the outbox's
// rows to the owed table below safe sends the owed walks back to them.
func TestClaimFloorOwedFloors(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	f := newClaimFloor(10, time.Hour)
	f.lastOldestWalk, f.highWater, f.safe, f.keyed.owed = now, 70, 60, 40
	fl := f.begin(now, phase{})
	f.end(fl, true)
	if fl.owed != 70 || fl.owedSafe != 60 || fl.owedKeyed != 40 || fl.beside() {
		t.Errorf("ordinary claim: %+v, want owed 70 safe 60 keyed 40", fl)
	}
	f.fresh.gaps = []span{{1, 2}} // far below next: a sweep
	f.fresh.next = 1 << 20
	fl = f.begin(now, phase{})
	f.end(fl, false)
	if !fl.fresh.belowFloor || fl.owed != math.MaxInt64 || fl.owedSafe != math.MaxInt64 || fl.owedKeyed != math.MaxInt64 {
		t.Errorf("sweep %+v: want the owed table's walks and probes past every row", fl)
	}

	f.highWater, f.safe = 500, 400
	f.movedToOwed(120)
	if f.safe != 119 || f.highWater != 119 {
		t.Errorf("after rows moved from 120: safe %d mark %d, want 119 119", f.safe, f.highWater)
	}
	f.movedToOwed(450)
	if f.safe != 119 {
		t.Errorf("rows moved above safe lowered it to %d", f.safe)
	}

	// Rows put back in line (a notification's payload) send the keyed
	// floor back too.
	f.highWater, f.safe, f.keyed.owed = 500, 400, 300
	f.putBack(90)
	if f.safe != 89 || f.highWater != 89 || f.keyed.owed != 89 {
		t.Errorf("after rows put back from 90: safe %d mark %d keyed %d, want 89 89 89", f.safe, f.highWater, f.keyed.owed)
	}
	f.putBack(200)
	if f.safe != 89 || f.keyed.owed != 89 {
		t.Errorf("rows put back above the floors raised them to %d, %d", f.safe, f.keyed.owed)
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
		fl := f.begin(now, phase{})
		defer f.end(fl, true)
		return f.claimed(fresh(rows...), fl, snapshot{xmin: xmax, xmax: xmax, xid: xmax}, time.Millisecond)
	}
	if claim(100, 5000) || claim(101, 9000) {
		t.Fatal("a reset with xmax going up")
	}
	f.mu.Lock()
	f.fresh.gaps = []span{{10, 20}} // far below next: a sweep
	f.mu.Unlock()
	sweep := f.begin(now, phase{})
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

// The owed floors count the targets of the phase the claims before ran: a
// claim of a phase that enables another walks the owed table from its
// oldest row; one of the same phase, or of fewer targets, from the floors.
func TestClaimFloorOwedFloorsFollowThePhase(t *testing.T) {
	t.Parallel()
	amqpOnly, natsOnly := phase{perTarget[bool]{AMQP: true}}, phase{perTarget[bool]{NATS: true}}
	for _, tc := range []struct {
		name        string
		last, claim phase
		fromOldest  bool
	}{
		{"the same phase", dualWrite, dualWrite, false},
		{"fewer targets", dualWrite, amqpOnly, false},
		{"JetStream enabled again", amqpOnly, dualWrite, true},
		{"the other target", amqpOnly, natsOnly, true},
		{"no claim yet", phase{}, amqpOnly, true},
	} {
		now := time.Now()
		f := newClaimFloor(10, time.Hour)
		f.highWater, f.safe, f.keyed.owed, f.owedFor = 70, 60, 50, tc.last
		fl := f.begin(now, tc.claim)
		f.end(fl, true)
		if got := fl.owed == 0 && fl.owedSafe == 0 && fl.owedKeyed == 0; got != tc.fromOldest || fl.beside() {
			t.Errorf("%s: owed floors %d, %d, %d (a sweep: %v); want from the oldest row: %v", tc.name, fl.owed, fl.owedSafe, fl.owedKeyed, fl.beside(), tc.fromOldest)
		}
	}
}
