package amqpsink_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/sinktest"
)

// Close does not wait on a broker that stopped reading the connection (as
// RabbitMQ does with a connection it blocks during a resource alarm): the
// close handshake gives up after its deadline, so relayd can exit.
func TestCloseIsBoundedWhenTheBrokerStopsReading(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	// Nothing the sink sends reaches RabbitMQ from here on; RabbitMQ itself
	// would end the connection only after missing its heartbeats (20 s).
	toxic, err := json.Marshal(map[string]any{"name": "deaf", "type": "timeout", "stream": "upstream",
		"attributes": map[string]any{"timeout": 0}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.proxy.Toxics.AddToxicJson(bytes.NewReader(toxic)); err != nil {
		t.Fatalf("add timeout: %v", err)
	}
	start := time.Now()
	closed := make(chan struct{})
	go func() { e.sink.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("closed in %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("Sink.Close still waiting after 10 s on a connection the broker does not read")
	}
}

// A resource alarm, a real one on a RabbitMQ node of the test's own:
// RabbitMQ blocks the publishing connection and stops reading from it. No
// message is queued twice. Publishes RabbitMQ had not read yet wait in the
// socket and are read, queued and confirmed once the alarm clears (to
// OnLateConfirm, their batch having given up); a retry of them, during the
// alarm or after it, sends nothing new; and while the connection is
// blocked the sink is not Ready and says why. (The sink used to close a
// blocked connection: every publish in flight became an unknown to retry,
// and each one RabbitMQ had read was queued again.)
func TestResourceAlarmQueuesEachMessageOnce(t *testing.T) {
	t.Parallel()
	node := testenv.NewRabbitNode(t)
	e := setupReadyAt(t, node.URL, nil)
	late := lateConfirms(e.sink)
	before := sinktest.Messages("prealarm", 20)
	sinktest.RequireAllNil(t, before, sinktest.Publish(t, e.sink, 10*time.Second, before))

	node.MemoryAlarm(true)
	msgs := sinktest.Messages("alarm", 300)
	// RabbitMQ blocks the connection at its first publish after the alarm:
	// it reads that one (at least) and then nothing more.
	notUnavailable := func(when string, results []error) {
		t.Helper()
		for i, err := range results {
			if err != nil && !errors.Is(err, relay.ErrUnavailable) {
				t.Fatalf("%s: %s: %v, want confirmed or unavailable", when, msgs[i].MessageID, err)
			}
		}
	}
	notUnavailable("during the alarm", sinktest.Publish(t, e.sink, 2*time.Second, msgs))
	testenv.Eventually(t, 10*time.Second, func() bool { return e.sink.Ready() != nil }, "sink Ready while RabbitMQ blocks its connection")
	if err := e.sink.Ready(); !errors.Is(err, relay.ErrUnavailable) || !strings.Contains(err.Error(), "blocked") {
		t.Fatalf("Ready during the alarm: %v, want unavailable, saying the connection is blocked", err)
	}
	// The relay's retry of the batch, still during the alarm.
	retry := sinktest.Publish(t, e.sink, time.Second, msgs)
	notUnavailable("retried during the alarm", retry)
	waited := 0
	for _, err := range retry {
		if errors.Is(err, relay.ErrAwaitingConfirm) {
			waited++ // its first publish is still unanswered: waited for, not sent again
		}
	}
	if waited == 0 {
		t.Fatal("no retry waited for its first publish's confirm: were the first publishes dropped?")
	}
	// And a batch of messages never sent is refused at once, unwritten.
	fresh := sinktest.Messages("blocked", 5)
	start := time.Now()
	res := sinktest.Publish(t, e.sink, 5*time.Second, fresh)
	sinktest.RequireAllUnavailable(t, fresh, res)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("publish onto a blocked connection took %v, want an answer at once", took)
	}
	for i, err := range res {
		if !strings.Contains(err.Error(), "blocked") {
			t.Fatalf("%s refused with %v, want it to say the connection is blocked", fresh[i].MessageID, err)
		}
	}

	node.MemoryAlarm(false)
	testenv.Eventually(t, 10*time.Second, func() bool { return e.sink.Ready() == nil }, "sink not Ready after the alarm cleared")
	testenv.Eventually(t, 10*time.Second, func() bool { return late() > 0 }, "no late confirm after the alarm cleared")
	// The relay retries what it had no verdict for: each is confirmed.
	sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 20*time.Second, msgs))
	sinktest.RequireAllNil(t, fresh, sinktest.Publish(t, e.sink, 20*time.Second, fresh))
	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), append(append(before, msgs...), fresh...), 1)
}

// The connection dies while RabbitMQ blocks it (here the sink's socket is
// closed under it). Its unanswered publishes come back as awaiting confirm
// — RabbitMQ may still read them from its socket buffer when the alarm
// clears — so the relay holds them back; and the connection that replaces
// it is not Ready, and sends RabbitMQ nothing but one probe, until RabbitMQ
// reads again. Then everything arrives.
func TestConnectionLostDuringAnAlarm(t *testing.T) {
	t.Parallel()
	node := testenv.NewRabbitNode(t)
	var mu sync.Mutex
	var conns []net.Conn
	e := setupReadyAt(t, node.URL, func(c *amqpsink.Config) {
		amqpsink.WrapConn(c, func(nc net.Conn) net.Conn {
			mu.Lock()
			defer mu.Unlock()
			conns = append(conns, nc)
			return nc
		})
	})
	node.MemoryAlarm(true)
	msgs := sinktest.Messages("lost", 100)
	first := sinktest.Publish(t, e.sink, time.Second, msgs) // RabbitMQ blocks the connection at the first
	testenv.Eventually(t, 10*time.Second, func() bool { return e.sink.Ready() != nil }, "sink Ready while RabbitMQ blocks its connection")
	var owed []*relay.Message // what the relay would publish again: not confirmed
	for i, err := range first {
		if err != nil {
			owed = append(owed, msgs[i])
		}
	}

	// The relay's retry, while the connection dies under it.
	var retry []error
	done := make(chan struct{})
	go func() { defer close(done); retry, _ = publishOf(e.sink, 5*time.Second, owed) }()
	time.Sleep(time.Second) // the retry is waiting (its ctx: 5 s): pacing, not a wait for a result
	mu.Lock()
	conns[0].Close()
	mu.Unlock()
	<-done
	for i, err := range retry {
		if !errors.Is(err, relay.ErrAwaitingConfirm) {
			t.Fatalf("%s after its connection died while blocked: %v, want awaiting confirm", owed[i].MessageID, err)
		}
	}
	// A new connection comes, and stays unready: RabbitMQ blocks it at the
	// probe.
	testenv.Eventually(t, 15*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(conns) >= 2 }, "no new connection")
	time.Sleep(2 * time.Second) // long enough for a reconnected sink to call itself Ready: pacing
	if err := e.sink.Ready(); err == nil || !strings.Contains(err.Error(), "blocked") {
		t.Fatalf("Ready on the connection that replaced a blocked one, during the alarm: %v, want blocked", err)
	}
	fresh := sinktest.Messages("fresh", 5)
	sinktest.RequireAllUnavailable(t, fresh, sinktest.Publish(t, e.sink, time.Second, fresh))

	node.MemoryAlarm(false)
	testenv.Eventually(t, 15*time.Second, func() bool { return e.sink.Ready() == nil }, "sink not Ready after the alarm cleared")
	sinktest.RequireAllNil(t, fresh, sinktest.Publish(t, e.sink, 20*time.Second, fresh))
	sinktest.RequireAllNil(t, owed, sinktest.Publish(t, e.sink, 20*time.Second, owed))
	got := sinktest.Settle(t, e.sink, e)
	// What the dead connection had written and RabbitMQ had not read came
	// in when the alarm cleared, and the retry above sent it again: those
	// (at most the batch) are the unknowns the relay's guarantees allow.
	for _, m := range fresh {
		if n := len(got[m.MessageID]); n != 1 {
			t.Errorf("%s, published once the alarm cleared, at the broker %d times, want 1", m.MessageID, n)
		}
	}
	if extra := len(got) - len(fresh) - len(msgs) - 1; extra != 0 { // 1: the sentinel
		t.Errorf("%d messages at the broker that were never published (the probe?)", extra)
	}
	twice := 0
	for _, m := range msgs {
		switch n := len(got[m.MessageID]); {
		case n == 2:
			twice++
		case n != 1:
			t.Errorf("%s at the broker %d times, want 1 (or 2: written before the connection died)", m.MessageID, n)
		}
	}
	t.Logf("%d of the %d messages written before the connection died came twice", twice, len(msgs))
}
