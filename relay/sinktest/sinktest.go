// Package sinktest is the conformance suite every relay.Sink must pass:
// publish and confirm, concurrent publishes, duplicates, broker down and
// broker back. The relay's delivery guarantees rest on the Sink contract
// (relay/sink.go); this suite checks it against the real broker, so a new
// sink, or a change to an old one, is held to the same behaviour.
//
// A sink's own tests call Run with a Harness that builds the sink against a
// broker of the test's own (its own exchange and queue, or stream), and a
// Broker that shows the suite what arrived and can take the broker away and
// bring it back.
package sinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// TopicPrefix starts every topic the suite publishes. A harness must route
// every topic under it to where its Broker's Received looks (an AMQP queue
// bound with "sinktest.#"; a stream capturing the sink's subject prefix).
const TopicPrefix = "sinktest."

// Traceparent is the W3C trace header every suite message carries.
const Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// Delivery is one copy of a message as the test saw it at the broker.
type Delivery struct {
	Headers map[string]string // every header the broker has, the sink's own included
	Payload []byte
}

// Broker is the harness's view of the broker one sink publishes to.
type Broker interface {
	// Received returns every message seen at the broker for this test so
	// far: message id -> one Delivery per copy. A message that the broker
	// holds twice is listed twice. It must not block for long; the suite
	// polls it.
	Received(t *testing.T) map[string][]Delivery
	// Down makes the broker unreachable for the sink: live connections
	// drop and new ones are refused. It returns once that holds. It may
	// call t.Skip when this broker cannot be taken down (a shared server).
	Down(t *testing.T)
	// Up undoes Down: the broker listens on the same address again, with
	// the same data, and Up returns once it accepts publishes. Reconnecting
	// is the sink's business, not Up's.
	Up(t *testing.T)
}

// DuplicateCounter is implemented by a Broker that counts the duplicate
// acknowledgements its sink reported (natssink's OnDuplicate hook).
type DuplicateCounter interface {
	Duplicates() int
}

// Harness is what a sink's test gives the suite.
type Harness struct {
	// New returns a new sink, publishing to a broker of this test's own,
	// and that broker. It registers its own cleanup with t.Cleanup.
	// Required.
	New func(t *testing.T) (relay.Sink, Broker)
	// Dedupes says the broker stores a repeated MessageID once (JetStream
	// inside its duplicate window). When false (RabbitMQ), a repeat is
	// stored again, and the suite asserts exactly that.
	Dedupes bool
}

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
	t.Run("ReadyAfterNew", func(t *testing.T) {
		t.Parallel()
		testReadyAfterNew(t, h)
	})
	t.Run("PublishConfirm", func(t *testing.T) {
		t.Parallel()
		testPublishConfirm(t, h)
	})
	t.Run("ConcurrentPublish", func(t *testing.T) {
		t.Parallel()
		testConcurrentPublish(t, h)
	})
	t.Run("Duplicate", func(t *testing.T) {
		t.Parallel()
		testDuplicate(t, h)
	})
	t.Run("Outage", func(t *testing.T) {
		t.Parallel()
		testOutage(t, h)
	})
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

// The broker goes away and comes back under one sink.
func testOutage(t *testing.T, h Harness) {
	sink, b := newReady(t, h)
	warm := Messages("warm", 1)
	RequireAllNil(t, warm, Publish(t, sink, publishTimeout, warm))
	WaitArrived(t, b, warm)

	wentDown := false
	var confirmed []*relay.Message // confirmed by the publish the outage cut into
	t.Run("BrokerDown", func(t *testing.T) {
		// The broker goes away while a publish waits for its verdicts:
		// the publish returns within its deadline, each message either
		// confirmed or "unknown".
		inflight := Messages("inflight", 1000)
		type outcome struct {
			results []error
			problem string
		}
		done := make(chan outcome, 1)
		go func() {
			r, p := publish(sink, outageTimeout, inflight)
			done <- outcome{r, p}
		}()
		// Down may skip (Goexit): the publish is still waited for.
		var o outcome
		received := false
		defer func() {
			if !received {
				<-done
			}
		}()
		// Cut in once the first of them reached the broker.
		testenv.Eventually(t, arriveTimeout, func() bool {
			got := b.Received(t)
			for _, m := range inflight {
				if len(got[m.MessageID]) > 0 {
					return true
				}
			}
			return false
		}, "none of %d messages published reached the broker", len(inflight))
		b.Down(t)
		wentDown = true
		o, received = <-done, true
		if o.problem != "" {
			t.Fatalf("Publish of %d messages cut by the outage: %s", len(inflight), o.problem)
		}
		unknown := 0
		for i, err := range o.results {
			switch {
			case err == nil:
				confirmed = append(confirmed, inflight[i])
			case errors.Is(err, relay.ErrUnavailable):
				unknown++
			default:
				t.Errorf("message %s cut by the outage: result %v (%T), want nil or an error wrapping relay.ErrUnavailable", inflight[i].MessageID, err, err)
			}
		}
		t.Logf("publish cut by the outage: %d confirmed, %d unknown", len(confirmed), unknown)

		// At once, before the sink may have noticed: no verdict can come,
		// so every message is "unknown", within the deadline.
		msgs := Messages("down1", 20)
		RequireAllUnavailable(t, msgs, Publish(t, sink, outageTimeout, msgs))

		var last error
		testenv.Eventually(t, readyTimeout, func() bool { last = sink.Ready(); return last != nil },
			"Ready() still nil after the broker went down")
		if !errors.Is(last, relay.ErrUnavailable) {
			t.Fatalf("Ready() = %v while the broker is down, want an error wrapping relay.ErrUnavailable", last)
		}

		msgs = Messages("down2", 20)
		RequireAllUnavailable(t, msgs, Publish(t, sink, outageTimeout, msgs))
		if err := sink.Ready(); !errors.Is(err, relay.ErrUnavailable) {
			t.Fatalf("Ready() = %v after publishing to a down broker, want an error wrapping relay.ErrUnavailable", err)
		}
	})
	t.Run("BrokerBack", func(t *testing.T) {
		if !wentDown {
			t.Skip("the broker never went down")
		}
		b.Up(t)
		testenv.Eventually(t, reconnectLimit, func() bool { return sink.Ready() == nil },
			"Ready() = %v: the sink did not reconnect by itself", lazy(func() string { return fmt.Sprint(sink.Ready()) }))

		msgs := Messages("back", 10)
		RequireAllNil(t, msgs, Publish(t, sink, publishTimeout, msgs))
		got := WaitArrived(t, b, msgs)
		for _, m := range msgs {
			if n := len(got[m.MessageID]); n != 1 {
				t.Errorf("message %s published after the outage is at the broker %d times, want 1", m.MessageID, n)
			}
		}
		// What was confirmed before or during the outage is still there:
		// a confirm is a promise.
		WaitArrived(t, b, append(confirmed, warm...))
	})
}

// lazy is formatted by calling it, so a failure message shows the state at
// the time of the failure, not when Eventually was called.
type lazy func() string

func (l lazy) String() string { return l() }

// Messages returns n messages with distinct ids (fresh for every call),
// topics under TopicPrefix, a traceparent and other headers, and distinct
// payloads with bytes that text handling would mangle. Every tenth has no
// headers and an empty payload.
func Messages(name string, n int) []*relay.Message {
	base := testenv.Name(name)
	msgs := make([]*relay.Message, n)
	for i := range msgs {
		m := &relay.Message{
			ID:        int64(i + 1),
			MessageID: fmt.Sprintf("%s-%04d", base, i),
			Topic:     fmt.Sprintf("%s%s.t%d", TopicPrefix, name, i%4),
			CreatedAt: time.Now(),
		}
		if i%10 != 9 {
			m.Headers = map[string]string{
				"traceparent": Traceparent,
				"x-index":     fmt.Sprint(i),
				"x-text":      "grüße ✓",
			}
			m.Payload = append([]byte(fmt.Sprintf(`{"i":%d}`, i)), 0x00, 0xff, '\r', '\n')
		}
		msgs[i] = m
	}
	return msgs
}

// errNotSet prefills results: a sink must set every result.
var errNotSet = errors.New("sinktest: result not set by Publish")

// Publish calls sink.Publish under a ctx of timeout and returns the
// results. It fails the test if Publish panics, or is still running grace
// after the deadline.
func Publish(t *testing.T, sink relay.Sink, timeout time.Duration, msgs []*relay.Message) []error {
	t.Helper()
	results, problem := publish(sink, timeout, msgs)
	if problem != "" {
		t.Fatalf("Publish of %d messages: %s", len(msgs), problem)
	}
	return results
}

// publish is Publish without t, for other goroutines. problem is non-empty
// when Publish panicked or hung.
func publish(sink relay.Sink, timeout time.Duration, msgs []*relay.Message) (results []error, problem string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	results = make([]error, len(msgs))
	for i := range results {
		results[i] = errNotSet
	}
	done := make(chan string, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Sprintf("panicked: %v", r)
			}
		}()
		sink.Publish(ctx, msgs, results)
		done <- ""
	}()
	timer := time.NewTimer(timeout + grace)
	defer timer.Stop()
	select {
	case problem = <-done:
		if problem != "" {
			return nil, problem
		}
		return results, ""
	case <-timer.C:
		// The results slice stays with the hung call: it may still write.
		return nil, fmt.Sprintf("still running %v after its ctx deadline (%v); goroutines:\n%s", grace, timeout, goroutines())
	}
}

// goroutines is a dump of every goroutine, to show where a hung Publish is
// stuck, capped at 256 KiB.
func goroutines() []byte {
	buf := make([]byte, 256<<10)
	return buf[:runtime.Stack(buf, true)]
}

// RequireAllNil fails unless every result is nil.
func RequireAllNil(t *testing.T, msgs []*relay.Message, results []error) {
	t.Helper()
	var bad []string
	for i, err := range results {
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", msgs[i].MessageID, err))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d of %d messages not confirmed, want all; first: %s", len(bad), len(msgs), bad[0])
	}
}

// RequireAllUnavailable fails unless every result wraps relay.ErrUnavailable.
func RequireAllUnavailable(t *testing.T, msgs []*relay.Message, results []error) {
	t.Helper()
	for i, err := range results {
		switch {
		case err == nil:
			t.Fatalf("message %s confirmed (nil) while the broker is down", msgs[i].MessageID)
		case !errors.Is(err, relay.ErrUnavailable):
			t.Fatalf("message %s: result %v (%T) while the broker is down, want an error wrapping relay.ErrUnavailable", msgs[i].MessageID, err, err)
		}
	}
}

// WaitArrived polls until every message in msgs is at the broker at least
// once and returns what was received.
func WaitArrived(t *testing.T, b Broker, msgs []*relay.Message) map[string][]Delivery {
	t.Helper()
	var got map[string][]Delivery
	var missing []string
	testenv.Eventually(t, arriveTimeout, func() bool {
		got = b.Received(t)
		missing = missing[:0]
		for _, m := range msgs {
			if len(got[m.MessageID]) == 0 {
				missing = append(missing, m.MessageID)
			}
		}
		return len(missing) == 0
	}, "%v", lazy(func() string {
		return fmt.Sprintf("%d of %d confirmed messages never arrived at the broker, e.g. %v", len(missing), len(msgs), head(missing))
	}))
	return got
}

// Settle publishes one sentinel message and waits for it. Brokers keep the
// order of one publisher's messages to one queue or stream, so everything
// the sink published before is then at the broker too: a later copy cannot
// still be on its way. It returns what was received.
func Settle(t *testing.T, sink relay.Sink, b Broker) map[string][]Delivery {
	t.Helper()
	s := Messages("sentinel", 1)
	RequireAllNil(t, s, Publish(t, sink, publishTimeout, s))
	return WaitArrived(t, b, s)
}

// RequireCounts fails unless every message of msgs is at the broker want
// times, and nothing else is there but sentinels and the suite's own
// warm-up messages.
func RequireCounts(t *testing.T, got map[string][]Delivery, msgs []*relay.Message, want int) {
	t.Helper()
	sent := make(map[string]bool, len(msgs))
	var wrong []string
	for _, m := range msgs {
		sent[m.MessageID] = true
		if n := len(got[m.MessageID]); n != want {
			wrong = append(wrong, fmt.Sprintf("%s x%d", m.MessageID, n))
		}
	}
	var extra []string
	for id := range got {
		if !sent[id] && !strings.HasPrefix(id, "sentinel_") {
			extra = append(extra, id)
		}
	}
	sort.Strings(wrong)
	sort.Strings(extra)
	if len(wrong) > 0 {
		t.Errorf("%d of %d messages are not at the broker exactly %d time(s): %v", len(wrong), len(msgs), want, head(wrong))
	}
	if len(extra) > 0 {
		t.Errorf("%d messages at the broker that were never published: %v", len(extra), head(extra))
	}
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}
