package amqpsink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/sinktest"
)

// A confirm that comes after Publish gave up waiting is reported to
// OnLateConfirm, and the publish said it may come (ErrAwaitingConfirm, as
// well as unavailable): the relay records it, so that no instance publishes
// the message again.
func TestLateConfirmIsReported(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	late := lateConfirms(e.sink)
	toxic, err := json.Marshal(map[string]any{"name": "slow", "type": "latency", "stream": "downstream",
		"attributes": map[string]any{"latency": 1500}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.proxy.Toxics.AddToxicJson(bytes.NewReader(toxic)); err != nil {
		t.Fatalf("add latency: %v", err)
	}
	msgs := sinktest.Messages("late", 10)
	for i, err := range sinktest.Publish(t, e.sink, 300*time.Millisecond, msgs) {
		if !errors.Is(err, relay.ErrAwaitingConfirm) || !errors.Is(err, relay.ErrUnavailable) {
			t.Fatalf("%s: %v, want awaiting confirm (and unavailable)", msgs[i].MessageID, err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return late() == len(msgs) }, "late confirms not reported")
	if err := e.proxy.Toxics.RemoveToxic(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), msgs, 1)
}

// Late confirms come in while the relay retries their batch: each message is
// found either in flight or confirmed late, and none is queued twice. (A
// confirm between sendOne's two looks once left it in neither, and sent it
// again: TestResourceAlarmQueuesEachMessageOnce, under load.)
func TestRetryWhileLateConfirmsComeIn(t *testing.T) {
	t.Parallel()
	var holding atomic.Bool
	release := make(chan struct{})
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		amqpsink.BeforeEvent(c, func() {
			if holding.Load() {
				<-release
				time.Sleep(200 * time.Microsecond) // confirms trickle in while the retry is sent
			}
		})
	})
	late := lateConfirms(e.sink)
	msgs := sinktest.Messages("retried", 300)
	holding.Store(true)
	for i, err := range sinktest.Publish(t, e.sink, 2*time.Second, msgs) {
		if !errors.Is(err, relay.ErrAwaitingConfirm) {
			t.Fatalf("%s: %v, want awaiting confirm", msgs[i].MessageID, err)
		}
	}
	close(release)
	testenv.Eventually(t, 10*time.Second, func() bool { return late() > 0 }, "no late confirm")
	sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 20*time.Second, msgs))
	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), msgs, 1)
}

// The sink's event goroutine held up for longer than amqp091-go waits for a
// listener (5 s, as in a process frozen that long) while confirms and returns
// keep coming: none of them is lost, and each message still gets its own
// verdict — the returned ones returned, the others confirmed.
func TestEventsSurviveAStalledListener(t *testing.T) {
	t.Parallel()
	var once sync.Once
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		amqpsink.BeforeEvent(c, func() { once.Do(func() { time.Sleep(6 * time.Second) }) })
	})
	msgs := sinktest.Messages("stall", 30)
	unroutable := makeUnroutable(msgs, func(i int) bool { return i%3 == 1 })
	results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
	requireRouting(t, msgs, results, unroutable)
}

// While the event goroutine is held up, returns and confirms wait in their
// buffers side by side; a message's return is still applied before its
// confirm, batch after batch.
func TestReturnBeforeConfirmThroughTheBuffers(t *testing.T) {
	t.Parallel()
	var stall atomic.Bool
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		amqpsink.BeforeEvent(c, func() {
			if stall.CompareAndSwap(true, false) {
				time.Sleep(200 * time.Millisecond)
			}
		})
	})
	for round := range 5 {
		msgs := sinktest.Messages(fmt.Sprintf("order%d", round), 60)
		unroutable := makeUnroutable(msgs, func(i int) bool { return i%2 == 1 })
		stall.Store(true) // the batch's first event waits while the rest queue up
		results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
		requireRouting(t, msgs, results, unroutable)
	}
}

// Confirms that came before the connection was lost count, even when the
// event goroutine was held up and finds the loss at the same time as them:
// the session applies what was buffered before it ends. (Failing them as
// unknown would have the relay publish confirmed messages again.)
func TestConfirmsBufferedBeforeALossCount(t *testing.T) {
	t.Parallel()
	var once sync.Once
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		amqpsink.BeforeEvent(c, func() { once.Do(func() { time.Sleep(3 * time.Second) }) })
	})
	msgs := sinktest.Messages("lossbuf", 30)
	done := make(chan []error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		results := make([]error, len(msgs))
		e.sink.Publish(ctx, msgs, results)
		done <- results
	}()
	time.Sleep(2 * time.Second) // every confirm is in by now; the first is held up
	e.Down(t)
	for i, err := range <-done {
		if err != nil {
			t.Errorf("%s: %v, want confirmed (its confirm came before the loss)", msgs[i].MessageID, err)
		}
	}
}
