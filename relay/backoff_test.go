package relay

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// boundedFake is a fakeSink whose broker dedupes within a window
// (RetryBounder), as JetStream does.
type boundedFake struct {
	*fakeSink
	bound time.Duration
}

func (b boundedFake) RetryBound() time.Duration { return b.bound }

// A publish with an unknown outcome may have been stored: a broker that
// dedupes only within a window gets the row again inside it, however long
// the row's earlier failures made its backoff (here a minute: 1 s doubled
// for ten failures, capped at RetryMax).
func TestUnknownOutcomeRetriedWithinTheDedupeWindow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	n := newFake(TargetNATS)
	ids := f.insert(1, "orders.created")
	f.setRow(ids[0], "nats_attempts = 10")
	var once sync.Once
	n.setFail(func(*Message) error {
		var err error
		once.Do(func() { err = Unavailable(errors.New("nats: timeout")) })
		return err
	})
	f.start(Config{Sinks: []Sink{boundedFake{n, 300 * time.Millisecond}}, RetryMin: time.Second, RetryMax: time.Minute})
	testenv.Eventually(t, 10*time.Second, func() bool { return f.state(ids[0]).done }, "the row waited past the bound")
	if got, tries := n.count(ids[0]); got != 1 || tries != 2 {
		t.Fatalf("got/tried %d/%d, want 1/2", got, tries)
	}
}

func TestRetryBackoffIsCappedExponential(t *testing.T) {
	t.Parallel()
	r := &Relay{cfg: Config{RetryMin: time.Second, RetryMax: time.Minute}}
	for attempt, want := range map[int32]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 7: time.Minute, 40: time.Minute} {
		for range 20 {
			if d := r.retryBackoff(attempt); d < want/2 || d > want {
				t.Fatalf("attempt %d: backoff %v, want within [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
}

// A row refused for want of room waits about half as long as its topic
// has been refused, between RetryMin and RetryMax (its attempts do not
// grow); the refusals of a topic run until the target stores one of its
// rows, per target and topic.
func TestRoomBackoffGrowsWithTheRefusal(t *testing.T) {
	t.Parallel()
	r := &Relay{cfg: Config{RetryMin: time.Second, RetryMax: 5 * time.Minute}}
	for refused, want := range map[time.Duration]time.Duration{0: time.Second, time.Second: time.Second, 10 * time.Second: 5 * time.Second, time.Minute: 30 * time.Second, time.Hour: 5 * time.Minute} {
		for range 20 {
			if d := r.roomBackoff(refused); d < want/2 || d > want {
				t.Fatalf("refused for %v: backoff %v, want within [%v, %v]", refused, d, want/2, want)
			}
		}
	}
	var f roomRefusals
	const stale = 10 * time.Minute
	t0 := time.Now()
	if got := f.refused(TargetNATS, "a", t0, stale); !got.Equal(t0) {
		t.Fatalf("first refusal: since %v, want now", got)
	}
	if got := f.refused(TargetNATS, "a", t0.Add(time.Minute), stale); !got.Equal(t0) {
		t.Fatalf("second refusal: since %v, want the first's %v", got, t0)
	}
	if got := f.refused(TargetAMQP, "a", t0.Add(time.Minute), stale); !got.Equal(t0.Add(time.Minute)) {
		t.Fatal("another target's refusals counted")
	}
	f.stored(TargetNATS, "b")
	if got := f.refused(TargetNATS, "a", t0.Add(2*time.Minute), stale); !got.Equal(t0) {
		t.Fatal("another topic's delivery ended the refusals")
	}
	f.stored(TargetNATS, "a")
	t1 := t0.Add(3 * time.Minute)
	if got := f.refused(TargetNATS, "a", t1, stale); !got.Equal(t1) {
		t.Fatalf("after a delivery: since %v, want a new run from now", got)
	}
	// No refusal for longer than stale (another instance stored the
	// topic's rows): the run is over.
	if got := f.refused(TargetNATS, "a", t1.Add(stale+time.Second), stale); !got.Equal(t1.Add(stale + time.Second)) {
		t.Fatalf("after %v without a refusal: since %v, want a new run from now", stale, got)
	}
	// At the bound (both targets' runs), runs that are over make room.
	var g roomRefusals
	for i := range maxRefusedTopics {
		g.refused(Targets[i%2], fmt.Sprint(i), t0, stale)
	}
	late := t0.Add(stale + time.Second)
	if got := g.refused(TargetAMQP, "new", late, stale); !got.Equal(late) || g.n.Load() != 1 {
		t.Fatalf("at the bound with every run over: since %v, %d entries; want now and 1", got, g.n.Load())
	}
	if got := g.refused(TargetAMQP, "new", late.Add(time.Second), stale); !got.Equal(late) {
		t.Fatal("the new topic's run was not kept")
	}
}
