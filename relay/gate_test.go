package relay

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// With one broker down, the other keeps flowing; the down one is not even
// tried, and catches up once back.
func TestTargetsProgressIndependently(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	n.setDown(Unavailable(errors.New("nats: disconnected")))
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 50})
	ids := f.insert(500, "orders.created")
	testenv.Eventually(t, 20*time.Second, func() bool { return a.total() == len(ids) }, "amqp did not get every row while nats was down")
	// The fake counts a publish before its batch records it.
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, id := range ids[:10] {
			if !f.state(id).amqpDelivered {
				return false
			}
		}
		return true
	}, "the rows' batches not recorded")
	for _, id := range ids[:10] {
		if s := f.state(id); !s.amqpDelivered || s.natsDelivered || s.done {
			t.Fatalf("row %s: %+v, want amqp delivered only", id, s)
		}
		if _, tries := n.count(id); tries != 0 {
			t.Fatalf("nats was tried %d times while not ready", tries)
		}
	}
	n.setDown(nil)
	testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == len(ids) }, "nats did not catch up")
	for _, id := range ids {
		if ga, _ := a.count(id); ga != 1 {
			t.Fatalf("amqp got %s %d times, want once", id, ga)
		}
	}
}

// A batch that failed for want of the broker pauses the target and makes it
// unready; when no row comes after it, nothing can close the breaker, and
// the target used to stay unready (/readyz 503) until the next row. It is
// ready again once its pause ended and a batch's time passed with no new
// failure.
func TestPauseWithoutLaterRowsEndsUnready(t *testing.T) {
	t.Parallel()
	f := setup(t)
	n := newFake(TargetNATS)
	var failed atomic.Bool
	n.setFail(func(*Message) error {
		if failed.CompareAndSwap(false, true) {
			return Unavailable(errors.New("nats: timeout"))
		}
		return nil
	})
	id := f.insert(1, "orders.created")[0]
	r, _, _ := f.start(Config{Sinks: []Sink{n}, PublishTimeout: 500 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		RetryMin: time.Hour, RetryMax: time.Hour})
	testenv.Eventually(t, 10*time.Second, func() bool { return len(r.Unready()) > 0 }, "target not paused by the failed batch")
	// The row waits an hour (RetryMin): no batch closes the breaker.
	testenv.Eventually(t, 10*time.Second, func() bool { return len(r.Unready()) == 0 }, "target still unready with no batch since its pause")
	if got, tries := n.count(id); got != 0 || tries != 1 {
		t.Fatalf("row published %d times (%d confirmed), want once, failed: no batch after the pause", tries, got)
	}
}
