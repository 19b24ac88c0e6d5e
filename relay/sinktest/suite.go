package sinktest

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// Timeouts of the suite: generous, since they bound only failures.
const (
	publishTimeout = 20 * time.Second        // ctx of a publish that should succeed
	arriveTimeout  = 20 * time.Second        // until confirmed messages are seen at the broker
	outageTimeout  = 2 * time.Second         // ctx of a publish while the broker is down
	grace          = 1500 * time.Millisecond // how late after its ctx deadline Publish may return
	readyTimeout   = 5 * time.Second         // until Ready reports the broker down
	reconnectLimit = 20 * time.Second        // until Ready reports it back (capped backoff)
)

// Run runs the conformance suite against the sink h.New builds. Its
// subtests run in parallel with each other.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("sinktest: Harness.New is required")
	}
	for _, c := range []struct {
		name string
		test func(*testing.T, Harness)
	}{
		{"ReadyAfterNew", testReadyAfterNew},
		{"PublishConfirm", testPublishConfirm},
		{"ConcurrentPublish", testConcurrentPublish},
		{"Duplicate", testDuplicate},
		{"Outage", testOutage},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.test(t, h)
		})
	}
}

// newReady returns a sink from h.New once it reports Ready. Whether it is
// Ready at once is ReadyAfterNew's concern; the other subtests test what
// comes after.
func newReady(t *testing.T, h Harness) (relay.Sink, Broker) {
	t.Helper()
	sink, b := h.New(t)
	testenv.Eventually(t, readyTimeout, func() bool { return sink.Ready() == nil },
		"new sink never Ready: %v", lazy(func() string { return fmt.Sprint(sink.Ready()) }))
	return sink, b
}

// A sink that New returned with its broker up is Ready at once, and its
// first Publish is confirmed: the relay starts publishing right after New.
func testReadyAfterNew(t *testing.T, h Harness) {
	sink, b := h.New(t)
	if err := sink.Ready(); err != nil {
		t.Errorf("Ready() = %v right after New, want nil: the broker is up", err)
	}
	msgs := Messages("first", 1)
	results := Publish(t, sink, publishTimeout, msgs)
	if results[0] != nil {
		t.Fatalf("first Publish right after New: %v, want nil", results[0])
	}
	WaitArrived(t, b, msgs)
}

// 200 messages in one Publish: all confirmed, each arrives exactly once,
// with its headers and payload unchanged.
func testPublishConfirm(t *testing.T, h Harness) {
	sink, b := newReady(t, h)
	msgs := Messages("confirm", 200)
	results := Publish(t, sink, publishTimeout, msgs)
	RequireAllNil(t, msgs, results)

	WaitArrived(t, b, msgs)
	got := Settle(t, sink, b)
	RequireCounts(t, got, msgs, 1)
	for _, m := range msgs {
		d := got[m.MessageID][0]
		for k, v := range m.Headers {
			if d.Headers[k] != v {
				t.Errorf("message %s: header %q = %q at the broker, want %q (all headers: %v)", m.MessageID, k, d.Headers[k], v, d.Headers)
			}
		}
		if !bytes.Equal(d.Payload, m.Payload) {
			t.Errorf("message %s: payload %q at the broker, want %q", m.MessageID, d.Payload, m.Payload)
		}
	}
}

// 8 goroutines publish 250 messages each at once: every message confirmed
// and arrived once. Confirms paired with the wrong publish show up here.
func testConcurrentPublish(t *testing.T, h Harness) {
	sink, b := newReady(t, h)
	const workers, each = 8, 250
	batches := make([][]*relay.Message, workers)
	var all []*relay.Message
	for w := range batches {
		batches[w] = Messages(fmt.Sprintf("conc%d", w), each)
		all = append(all, batches[w]...)
	}
	results := make([][]error, workers)
	problems := make([]string, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[w], problems[w] = publish(sink, publishTimeout, batches[w])
		}()
	}
	close(start)
	wg.Wait()
	for w := range batches {
		if problems[w] != "" {
			t.Fatalf("worker %d: Publish of %d messages: %s", w, each, problems[w])
		}
		RequireAllNil(t, batches[w], results[w])
	}
	WaitArrived(t, b, all)
	RequireCounts(t, Settle(t, sink, b), all, 1)
}

// The same message id published twice, as a retry would: both confirmed;
// the broker holds it once if it dedupes, twice if it does not.
func testDuplicate(t *testing.T, h Harness) {
	sink, b := newReady(t, h)
	m := Messages("dup", 1)
	again := *m[0]
	RequireAllNil(t, m, Publish(t, sink, publishTimeout, m))
	RequireAllNil(t, m, Publish(t, sink, publishTimeout, []*relay.Message{&again}))

	want := 2
	if h.Dedupes {
		want = 1
	}
	// The sentinel is published after both, so once it is there, so is
	// any copy the broker kept.
	got := Settle(t, sink, b)
	if n := len(got[m[0].MessageID]); n != want {
		t.Fatalf("message published twice is at the broker %d times, want %d (Dedupes=%v)", n, want, h.Dedupes)
	}
	if dc, ok := b.(DuplicateCounter); ok {
		if n := dc.Duplicates(); n != 1 {
			t.Fatalf("sink reported %d duplicate acks, want 1", n)
		}
	}
}
