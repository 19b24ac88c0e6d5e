package relay

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// A NOTIFY wakes one idle worker, not every one: the others' claims would
// come back empty, a transaction each per producer commit.
func TestNotifyWakesOneWorker(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var claims, empty atomic.Int64
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 4, PollInterval: time.Hour}, func(r *Relay) {
		r.hooks = &testHooks{claimed: func(rows int, _ floors) {
			claims.Add(1)
			if rows == 0 {
				empty.Add(1)
			}
		}}
	})

	// Each worker claims once at start, and one more after LISTEN is up.
	testenv.Eventually(t, 10*time.Second, func() bool { return claims.Load() >= 5 }, "relay did not start")
	time.Sleep(100 * time.Millisecond)
	before := empty.Load()

	const commits = 40
	for i := range commits {
		f.insert(1, "orders.created")
		testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == i+1 }, "row not delivered after its NOTIFY")
	}
	if got := empty.Load() - before; got > commits/4 {
		t.Errorf("%d empty claims for %d single-row commits with 4 idle workers: a NOTIFY woke more than one worker", got, commits)
	}
	t.Logf("%d claims, %d empty, for %d commits", claims.Load(), empty.Load()-before, commits)
}

// In a keyed backlog with few keys, every key's next row is in flight in
// some batch: a full batch must not wake idle workers into claims that find
// nothing (one wasted walk of the keyed window per batch). The worker that
// finishes a batch claims the keys it freed; the others wait for a NOTIFY.
func TestFullKeyedBatchesDoNotWakeWorkersWhoseClaimWasEmpty(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const keys, perKey = 5, 40
	keyOf := f.insertKeyed(keys, perKey)
	var claims, empty atomic.Int64
	f.startWith(Config{Sinks: []Sink{newFake(TargetAMQP), newFake(TargetNATS)}, Workers: 8, BatchSize: 2 * keys, PollInterval: time.Hour},
		func(r *Relay) {
			r.hooks = &testHooks{claimed: func(rows int, _ floors) {
				claims.Add(1)
				if rows == 0 {
					empty.Add(1)
				}
			}}
		})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(keyOf) }, "keyed backlog not delivered")
	// Every batch takes each key's next row: perKey full batches. At start
	// each of the 8 workers claims once, and one more claims when LISTEN is
	// up; those may come back empty.
	if got := empty.Load(); got > 8+1+perKey/4 {
		t.Errorf("%d empty claims of %d for %d full batches: full batches woke workers whose claim had found nothing", got, claims.Load(), perKey)
	}
	t.Logf("%d claims, %d empty", claims.Load(), empty.Load())
}

// A burst of a few keys' rows drains at batch speed, with no NOTIFY or poll
// after the first claim: a worker whose batch held keys claims again, for
// their next rows. It waited for the next NOTIFY or PollInterval (an hour
// here): one row per key per poll.
func TestKeyedBurstDrainsWithoutPolls(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	f.startWith(Config{Sinks: []Sink{a, n}, Workers: 2, PollInterval: time.Hour}, nil)
	keyOf := f.insertKeyed(3, 20)
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(keyOf) }, "keyed burst not drained")
	checkKeyOrder(t, "amqp", a.confirmedOrder(), keyOf)
	checkKeyOrder(t, "nats", n.confirmedOrder(), keyOf)
}
