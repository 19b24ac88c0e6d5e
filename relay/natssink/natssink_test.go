package natssink_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/natssink"
	"github.com/relayd/relayd/relay/sinktest"
)

// Every goroutine started here (embedded servers, connections, the
// JetStream async publisher) must be gone when the tests end: nothing is
// ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	// Against a JetStream server of the test's own, which the outage
	// subtests stop and restart on the same port and store directory.
	t.Run("Embedded", func(t *testing.T) {
		t.Parallel()
		sinktest.Run(t, sinktest.Harness{
			New:     func(t *testing.T) (relay.Sink, sinktest.Broker) { e := setupEmbedded(t); return e.sink, e },
			Dedupes: true,
		})
	})
	// Against the shared server (the version the project runs); it is never
	// stopped, so the outage subtests skip here.
	t.Run("Shared", func(t *testing.T) {
		t.Parallel()
		sinktest.Run(t, sinktest.Harness{
			New:     func(t *testing.T) (relay.Sink, sinktest.Broker) { e := setupShared(t); return e.sink, e },
			Dedupes: true,
		})
	})
}

// Topics that are not valid subjects are permanent, and do not stop the
// valid message of the same batch.
func TestInvalidSubjectIsPermanent(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	for _, topic := range []string{"a b", "a.*", "a.>", "*", ">", "a..b", "a.", ".a", "", "a\tb"} {
		msgs := sinktest.Messages("badsubject", 2)
		msgs[0].Topic = topic
		results := sinktest.Publish(t, e.sink, 10*time.Second, msgs)
		var pe *relay.PermanentError
		if !errors.As(results[0], &pe) {
			t.Errorf("topic %q: result %v (%T), want a *relay.PermanentError", topic, results[0], results[0])
		}
		if results[1] != nil {
			t.Errorf("valid message in the same batch as topic %q: %v, want nil", topic, results[1])
		}
	}
}

// A header key nats.go refuses (it fails the whole message), or a Nats-
// header that would steer JetStream (Nats-Rollup purges the subject), is
// permanent:
// the row is parked with the reason, not retried as an outage for ever; the
// batch's other messages are published.
func TestHeaderKeyNATSRefusesIsPermanent(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	for _, key := range []string{"x-trace/id", "a=b", "café", "a b", "{k}", "Nats-Rollup", "Nats-Msg-Id"} {
		msgs := sinktest.Messages("badheader", 3)
		msgs[1].Headers = map[string]string{"ok": "1", key: "v"}
		results := sinktest.Publish(t, e.sink, 10*time.Second, msgs)
		var pe *relay.PermanentError
		if !errors.As(results[1], &pe) || errors.Is(results[1], relay.ErrUnavailable) || !strings.Contains(pe.Error(), key) {
			t.Errorf("header key %q: result %v (%T), want a *relay.PermanentError naming the key", key, results[1], results[1])
		}
		ok := []*relay.Message{msgs[0], msgs[2]}
		sinktest.RequireAllNil(t, ok, []error{results[0], results[2]})
		sinktest.WaitArrived(t, e, ok)
	}
}

// The sink's rule for header keys is nats.go's: every byte, in a key of its
// own, is refused by one exactly when it is by the other.
func TestNATSKeyRuleMatchesTheClient(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	for c := 1; c < 256; c++ {
		key := "k" + string([]byte{byte(c)})
		err := e.nc.PublishMsg(&nats.Msg{Subject: "keyrule", Header: nats.Header{key: {"v"}}})
		clientRefuses := errors.Is(err, nats.ErrBadHeaderMsg)
		if err != nil && !clientRefuses {
			t.Fatalf("key %q: %v", key, err)
		}
		if ours := headers.NATSKeyReason(key) != ""; ours != clientRefuses {
			t.Errorf("key %q: refused by the sink's rule %v, by nats.go %v", key, ours, clientRefuses)
		}
	}
}

// A message over the server's max_payload is permanent, whether the sink's
// own size check or the client's catches it; one that fits is published.
func TestOversizePayloadIsPermanent(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	maxPayload := int(e.nc.MaxPayload())
	for _, tc := range []struct {
		name      string
		size      int
		headers   bool
		permanent bool
	}{
		{"payload alone over max_payload", maxPayload + 1, false, true},
		// The payload fits, the headers (Nats-Msg-Id and
		// Nats-Expected-Stream at least) push it over.
		{"payload plus headers over max_payload", maxPayload - 64, false, true},
		{"payload plus user headers over max_payload", maxPayload - 100, true, true},
		{"well under max_payload", maxPayload - 4096, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := sinktest.Messages("size", 1)
			msgs[0].Payload = make([]byte, tc.size)
			if !tc.headers {
				msgs[0].Headers = nil
			}
			results := sinktest.Publish(t, e.sink, 10*time.Second, msgs)
			if !tc.permanent {
				sinktest.RequireAllNil(t, msgs, results)
				sinktest.WaitArrived(t, e, msgs)
				return
			}
			var pe *relay.PermanentError
			if !errors.As(results[0], &pe) {
				t.Fatalf("payload of %d bytes (max_payload %d): result %v (%T), want a *relay.PermanentError", tc.size, maxPayload, results[0], results[0])
			}
		})
	}
}

// The sink publishes with Nats-Expected-Stream set to Stream: the stream is
// named right, so the publish is stored, under the expected-stream header.
// A sink naming a stream that does not exist waits for it (ErrNoStream,
// unavailable: no attempt used) and stores nothing.
func TestExpectStream(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	msgs := sinktest.Messages("expect", 1)
	sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 10*time.Second, msgs))
	got := sinktest.WaitArrived(t, e, msgs)
	if s := got[msgs[0].MessageID][0].Headers[jetstream.ExpectedStreamHeader]; s != e.stream {
		t.Errorf("stored message has %s %q, want %q", jetstream.ExpectedStreamHeader, s, e.stream)
	}

	wrong, err := natssink.New(natssink.Config{Conn: e.nc, Stream: e.stream + "_OTHER", SubjectPrefix: e.prefix, AckTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bad := sinktest.Messages("expect", 1)
	results := sinktest.Publish(t, wrong, 10*time.Second, bad)
	if !errors.Is(results[0], natssink.ErrNoStream) || !errors.Is(results[0], relay.ErrUnavailable) {
		t.Fatalf("sink configured with stream %q, which does not exist: result %v (%T), want ErrNoStream, unavailable", e.stream+"_OTHER", results[0], results[0])
	}
	if n := len(sinktest.Settle(t, e.sink, e)[bad[0].MessageID]); n != 0 {
		t.Fatalf("message refused for its expected stream is stored %d times, want 0", n)
	}
}

// A subject the stream does not capture is the twin of an unroutable AMQP
// message: retried, counting an attempt (not permanent, not the broker
// being down), and said at once naming the subject and the stream.
func TestSubjectTheStreamDoesNotCaptureIsRetried(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	var logged testenv.SyncBuffer
	orphan, err := natssink.New(natssink.Config{Conn: e.nc, Stream: e.stream, SubjectPrefix: "nostream." + e.prefix, AckTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	msgs := sinktest.Messages("orphan", 1)
	results := sinktest.Publish(t, orphan, 10*time.Second, msgs)
	if !errors.Is(results[0], natssink.ErrNotCaptured) || relay.IsPermanent(results[0]) || errors.Is(results[0], relay.ErrUnavailable) {
		t.Fatalf("result %v (%T), want ErrNotCaptured: a retry that counts an attempt", results[0], results[0])
	}
	if l := logged.String(); !strings.Contains(l, "subject=nostream."+e.prefix) || !strings.Contains(l, "stream="+e.stream) {
		t.Fatalf("log does not name the subject and the stream:\n%s", l)
	}
}

// env is one test's stream, the sink's connection and a reader of the
// stream; for an embedded server, the server too. It is the
// sinktest.Broker.
type env struct {
	sink   *natssink.Sink
	nc     *nats.Conn // the sink's
	js     jetstream.JetStream
	stream string
	prefix string
	dups   atomic.Int64

	srv  *natsserver.Server // nil for the shared server
	port int
	dir  string
	// owner is the test that made the env: a server restarted in one of
	// its subtests (Up) runs, and is stopped, with the env.
	owner *testing.T

	mu   sync.Mutex
	next uint64 // stream sequence Received reads from
	got  map[string][]sinktest.Delivery
}

var (
	_ sinktest.Broker           = (*env)(nil)
	_ sinktest.DuplicateCounter = (*env)(nil)
)

func setupShared(t *testing.T) *env {
	t.Helper()
	return setup(t, &env{}, testenv.NATSURL(t))
}

func setupEmbedded(t *testing.T) *env {
	t.Helper()
	e := &env{dir: t.TempDir(), owner: t}
	e.srv = startServer(t, natsserver.RANDOM_PORT, e.dir)
	e.port = e.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	})
	return setup(t, e, e.srv.ClientURL())
}

// startServer runs a JetStream server of the test's own on port, storing in
// dir, so the test can stop it without touching the shared server.
func startServer(t *testing.T, port int, dir string) *natsserver.Server {
	t.Helper()
	return testenv.NATSServer(t, &natsserver.Options{Port: port, JetStream: true, StoreDir: dir})
}

// setup makes the stream, the sink (on a connection that reconnects
// forever, every 100ms) and the reader's connection, on the server at url.
func setup(t *testing.T, e *env, url string) *env {
	t.Helper()
	name := testenv.Name("sinktest")
	e.stream = strings.ToUpper(name)
	e.prefix = name + "."
	e.got = map[string][]sinktest.Delivery{}
	e.next = 1

	reader := connect(t, url)
	var err error
	if e.js, err = jetstream.New(reader); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testenv.CreateStream(t, ctx, e.js, jetstream.StreamConfig{
		Name: e.stream, Subjects: []string{e.prefix + ">"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.js.DeleteStream(ctx, e.stream); err != nil && e.srv == nil {
			t.Errorf("delete stream %s: %v", e.stream, err) // an embedded server's goes with its dir
		}
	})

	e.nc = connect(t, url)
	e.sink, err = natssink.New(natssink.Config{
		Conn: e.nc, Stream: e.stream, SubjectPrefix: e.prefix, AckTimeout: 5 * time.Second,
		OnDuplicate: func() { e.dups.Add(1) },
	})
	if err != nil {
		t.Fatalf("natssink.New: %v", err)
	}
	return e
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("nats connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// setupReady waits for e's sink to be Ready, for the tests of what comes
// after; the conformance suite's ReadyAfterNew checks that it is at once.
func setupReady(t *testing.T, e *env) *env {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() bool { return e.sink.Ready() == nil }, "sink never Ready")
	return e
}

// Received implements sinktest.Broker: the stream's messages by
// Nats-Msg-Id, read from where the last call stopped.
func (e *env) Received(t *testing.T) map[string][]sinktest.Delivery {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatalf("stream %s: %v", e.stream, err)
	}
	last := st.CachedInfo().State.LastSeq
	if e.next <= last {
		cons, err := e.js.OrderedConsumer(ctx, e.stream, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: e.next,
		})
		if err != nil {
			t.Fatalf("ordered consumer on %s: %v", e.stream, err)
		}
		for e.next <= last {
			batch, err := cons.Fetch(int(min(last-e.next+1, 1000)), jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatalf("fetch from %s: %v", e.stream, err)
			}
			n := 0
			for m := range batch.Messages() {
				md, err := m.Metadata()
				if err != nil {
					t.Fatal(err)
				}
				h := map[string]string{}
				for k, v := range m.Headers() {
					h[k] = v[0]
				}
				id := m.Headers().Get(jetstream.MsgIDHeader)
				e.got[id] = append(e.got[id], sinktest.Delivery{Headers: h, Payload: m.Data()})
				e.next = md.Sequence.Stream + 1
				n++
			}
			if batch.Error() != nil || n == 0 {
				t.Fatalf("fetch from %s at %d of %d: %d messages, error %v", e.stream, e.next, last, n, batch.Error())
			}
		}
	}
	out := make(map[string][]sinktest.Delivery, len(e.got))
	for id, ds := range e.got {
		out[id] = append([]sinktest.Delivery(nil), ds...)
	}
	return out
}

// Down implements sinktest.Broker: the embedded server shuts down.
func (e *env) Down(t *testing.T) {
	if e.srv == nil {
		t.Skip("the shared NATS server is never stopped; the Embedded run covers outages")
	}
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// Up implements sinktest.Broker: a new server on the same port and store
// directory, so the stream survives; it returns once the stream answers.
func (e *env) Up(t *testing.T) {
	t.Helper()
	e.srv = startServer(e.owner, e.port, e.dir)
	testenv.Eventually(t, 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := e.js.Stream(ctx, e.stream)
		return err == nil
	}, "stream %s not back after the restart", e.stream)
}

// Duplicates implements sinktest.DuplicateCounter: the sink's OnDuplicate
// calls.
func (e *env) Duplicates() int { return int(e.dups.Load()) }

// A window (MaxPending) smaller than the batch, shared by two batches at
// once: each publish waits for room while its batch reads the PubAcks that
// free it, and every message is stored once.
func TestWindowSmallerThanTheBatches(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	small, err := natssink.New(natssink.Config{Conn: e.nc, Stream: e.stream, SubjectPrefix: e.prefix, MaxPending: 4, AckTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, b := sinktest.Messages("window-a", 300), sinktest.Messages("window-b", 300)
	var wg sync.WaitGroup
	var ra []error
	wg.Go(func() { ra = sinktest.Publish(t, small, 20*time.Second, a) })
	rb := sinktest.Publish(t, small, 20*time.Second, b)
	wg.Wait()
	sinktest.RequireAllNil(t, a, ra)
	sinktest.RequireAllNil(t, b, rb)
	got := sinktest.Settle(t, small, e)
	sinktest.RequireCounts(t, got, append(a, b...), 1)
}

// A publish whose PubAck never comes is unknown (publish again) once the
// ack timeout passes, not a hang: here a plain subscriber, not a stream,
// takes the subject, so nobody answers.
func TestNoPubAckIsUnavailableAfterTheAckTimeout(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	s, _ := silentSink(t, e, 300*time.Millisecond)
	msgs := sinktest.Messages("silent", 10)
	start := time.Now()
	results := sinktest.Publish(t, s, 20*time.Second, msgs)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Publish took %v with an ack timeout of 300ms", took)
	}
	sinktest.RequireAllUnavailable(t, msgs, results)
	if !errors.Is(results[0], jetstream.ErrAsyncPublishTimeout) {
		t.Errorf("result %v, want it to wrap jetstream.ErrAsyncPublishTimeout", results[0])
	}
}

// silentSink is a sink on e's connection whose subjects no stream captures
// but a plain subscriber (returned) takes: its messages go out, and nobody
// answers.
func silentSink(t *testing.T, e *env, ackTimeout time.Duration) (*natssink.Sink, *nats.Subscription) {
	t.Helper()
	silent := "silent." + e.prefix
	sub, err := e.nc.SubscribeSync(silent + ">")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() }) //nolint:errcheck
	s, err := natssink.New(natssink.Config{Conn: e.nc, Stream: e.stream, SubjectPrefix: silent, AckTimeout: ackTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return s, sub
}

// A disconnect while PubAcks are awaited fails the publishes still waiting
// at once (unknown: publish again), instead of holding the batch until the
// ack timeout.
func TestDisconnectFailsThePublishesWaiting(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	s, sub := silentSink(t, e, time.Minute)
	msgs := sinktest.Messages("cut", 10)
	go func() {
		// Once the messages reached the subscriber, the server goes.
		for range msgs {
			if _, err := sub.NextMsg(10 * time.Second); err != nil {
				break
			}
		}
		e.Down(t)
	}()
	start := time.Now()
	results := sinktest.Publish(t, s, 2*time.Minute, msgs)
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("Publish took %v: a disconnect should end the wait for PubAcks", took)
	}
	sinktest.RequireAllUnavailable(t, msgs, results)
	if !errors.Is(results[0], nats.ErrDisconnected) {
		t.Errorf("result %v, want it to wrap nats.ErrDisconnected", results[0])
	}
}

// A batch whose messages no stream captures asks JetStream once per subject
// whether a stream captures it, not once per message: a JetStream restart
// answers every message of a batch with "no responders".
func TestNoStreamIsAskedOncePerSubject(t *testing.T) {
	t.Parallel()
	e := setupReady(t, setupEmbedded(t))
	sub, err := e.nc.SubscribeSync("$JS.API.STREAM.NAMES")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	orphan, err := natssink.New(natssink.Config{Conn: e.nc, Stream: e.stream, SubjectPrefix: "nostream." + e.prefix, AckTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	msgs := sinktest.Messages("orphans", 50)
	for i, m := range msgs {
		m.Topic = []string{"a", "b"}[i%2]
	}
	results := sinktest.Publish(t, orphan, 10*time.Second, msgs)
	for i, err := range results {
		if !errors.Is(err, natssink.ErrNotCaptured) {
			t.Fatalf("message %d: result %v (%T), want ErrNotCaptured", i, err, err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := sub.Pending(); n != 2 {
		t.Errorf("JetStream asked %d times which stream captures the batch's 2 subjects, want 2", n)
	}
}

// A stream with DiscardNew at its limits refuses new messages until it has
// room: the broker's state, not the message's. Such a refusal is
// relay.ErrOutOfRoom — not a broker outage, not permanent: the row waits
// without using up its attempts — on the shared server (the version the
// project runs) and the embedded one, for MaxMsgs, MaxMsgsPerSubject and
// MaxBytes; the messages go in once there is room. A message larger than
// the stream's MaxBytes, which no room fits, is permanent.
func TestFullStreamIsOutOfRoom(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(*testing.T) *env
	}{{"Shared", setupShared}, {"Embedded", setupEmbedded}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setupReady(t, tc.setup(t))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			limit := func(maxMsgs, maxPerSubject, maxBytes int64) {
				t.Helper()
				s, err := e.js.Stream(ctx, e.stream)
				if err != nil {
					t.Fatal(err)
				}
				cfg := s.CachedInfo().Config
				cfg.MaxMsgs, cfg.MaxMsgsPerSubject, cfg.MaxBytes, cfg.Discard = maxMsgs, maxPerSubject, maxBytes, jetstream.DiscardNew
				cfg.DiscardNewPerSubject = maxPerSubject > 0
				if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
					t.Fatal(err)
				}
			}
			requireOutOfRoom := func(what string, err error, reason string) {
				t.Helper()
				if !errors.Is(err, relay.ErrOutOfRoom) || errors.Is(err, relay.ErrUnavailable) || relay.IsPermanent(err) || !strings.Contains(err.Error(), reason) {
					t.Errorf("%s: %v, want relay.ErrOutOfRoom saying %q", what, err, reason)
				}
			}
			var held, stored []*relay.Message

			limit(2, -1, -1)
			msgs := sinktest.Messages("full", 4)
			results := sinktest.Publish(t, e.sink, 10*time.Second, msgs)
			sinktest.RequireAllNil(t, msgs[:2], results[:2])
			for i, err := range results[2:] {
				requireOutOfRoom(fmt.Sprintf("message %d into a stream at MaxMsgs 2", i+2), err, "maximum messages exceeded")
			}
			stored, held = append(stored, msgs...), append(held, msgs[2:]...)

			limit(-1, 1, -1)
			one := sinktest.Messages("full.subject", 2)
			one[1].Topic = one[0].Topic
			results = sinktest.Publish(t, e.sink, 10*time.Second, one)
			sinktest.RequireAllNil(t, one[:1], results[:1])
			requireOutOfRoom("second message on a subject at MaxMsgsPerSubject 1", results[1], "maximum messages per subject exceeded")
			stored, held = append(stored, one...), append(held, one[1])

			// MaxBytes: what the stream holds now and a little more. A
			// message larger than the whole stream is permanent.
			s, err := e.js.Stream(ctx, e.stream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			limit(-1, -1, int64(info.State.Bytes)+2048)
			bytes := sinktest.Messages("full.bytes", 2)
			bytes[0].Payload = make([]byte, 4096)
			bytes[1].Payload = make([]byte, 2500)
			results = sinktest.Publish(t, e.sink, 10*time.Second, bytes)
			var pe *relay.PermanentError
			if !errors.As(results[0], &pe) || !strings.Contains(pe.Reason, "MaxBytes") {
				t.Errorf("message larger than the stream's MaxBytes: %v, want permanent, naming MaxBytes", results[0])
			}
			requireOutOfRoom("message over what is left of MaxBytes", results[1], "maximum bytes exceeded")
			stored, held = append(stored, bytes[1]), append(held, bytes[1])

			// Room again: the held ones go in, each once.
			limit(-1, -1, -1)
			sinktest.RequireAllNil(t, held, sinktest.Publish(t, e.sink, 10*time.Second, held))
			sinktest.WaitArrived(t, e, stored)
		})
	}
}

// RELAY_PROVISION creates a missing stream, and leaves one that exists as
// the operator made it: an update with relayd's few settings would put its
// limits, discard policy, duplicate window and other subjects back to their
// defaults. A stream whose subjects miss some of PREFIX> is reported.
func TestEnsureStreamLeavesAnExistingStreamAlone(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := testenv.NewStream(t, "ensure")
	own := jetstream.StreamConfig{Name: st.Name, Subjects: []string{st.Prefix + ">", "elsewhere_" + st.Prefix + "x"},
		MaxMsgs: 1000, Discard: jetstream.DiscardNew, Duplicates: time.Hour, MaxAge: 24 * time.Hour}
	if _, err := st.JS.UpdateStream(ctx, own); err != nil {
		t.Fatal(err)
	}
	for _, create := range []bool{true, false} {
		found, err := natssink.EnsureStream(ctx, st.NC, st.Name, st.Prefix, 2*time.Minute, create)
		if err != nil || found.Warning != "" || found.DuplicateWindow != time.Hour {
			t.Fatalf("create=%v: %+v, %v; want the stream's window (1h), no warning, no error", create, found, err)
		}
		info, err := st.Stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := info.Config
		if c.MaxMsgs != own.MaxMsgs || c.Discard != own.Discard || c.Duplicates != own.Duplicates || c.MaxAge != own.MaxAge || len(c.Subjects) != 2 {
			t.Fatalf("create=%v: the stream's settings changed: %+v", create, c)
		}
	}

	// Subjects that capture only some topics: a warning, not a refusal.
	narrow := testenv.NewStream(t, "ensurenarrow")
	if _, err := narrow.JS.UpdateStream(ctx, jetstream.StreamConfig{Name: narrow.Name, Subjects: []string{narrow.Prefix + "orders.>"}}); err != nil {
		t.Fatal(err)
	}
	if found, err := natssink.EnsureStream(ctx, narrow.NC, narrow.Name, narrow.Prefix, time.Minute, true); err != nil || !strings.Contains(found.Warning, "do not capture all of") {
		t.Fatalf("narrow stream: %+v, %v; want a warning", found, err)
	}

	// Missing: an error without create, made with it.
	name := strings.ToUpper(testenv.Name("ensuremissing"))
	prefix := strings.ToLower(name) + "."
	if _, err := natssink.EnsureStream(ctx, st.NC, name, prefix, time.Minute, false); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing stream without create: %v, want 'does not exist'", err)
	}
	if found, err := natssink.EnsureStream(ctx, st.NC, name, prefix, 90*time.Second, true); err != nil || found.Warning != "" || found.DuplicateWindow != 90*time.Second {
		t.Fatalf("missing stream with create: %+v, %v", found, err)
	}
	t.Cleanup(func() { st.JS.DeleteStream(context.Background(), name) }) //nolint:errcheck // best effort
	made, err := st.JS.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if c := made.CachedInfo().Config; c.Duplicates != 90*time.Second || c.Storage != jetstream.FileStorage || len(c.Subjects) != 1 || c.Subjects[0] != prefix+">" {
		t.Fatalf("created stream %+v, want file storage on %s> with a 90s duplicate window", c, prefix)
	}
}

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"outbox.>", "outbox.>", true},
		{">", "outbox.>", true},
		{"*.>", "outbox.>", true},
		{"outbox.*", "outbox.>", false},
		{"outbox.orders.>", "outbox.>", false},
		{"other.>", "outbox.>", false},
		{">", ">", true},
		{"outbox.>", "outbox", false},
		{"a.b", "a.b", true},
		{"a.*", "a.b", true},
		{"a", "*", false},
		{"a.b.c", "a.b", false},
	} {
		if got := natssink.Covers(c.filter, c.subject); got != c.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}

// The retry of a publish with an unknown outcome stays inside the stream's
// duplicate window: half of it less the ack timeout, a quarter at least.
func TestRetryBound(t *testing.T) {
	st := testenv.NewStream(t, "bound")
	for _, c := range []struct{ window, ack, want time.Duration }{
		{2 * time.Minute, 10 * time.Second, 50 * time.Second},
		{20 * time.Second, 10 * time.Second, 5 * time.Second},
		{0, 10 * time.Second, 50 * time.Second}, // JetStream's default window
	} {
		s, err := natssink.New(natssink.Config{Conn: st.NC, Stream: st.Name, AckTimeout: c.ack, DuplicateWindow: c.window})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.RetryBound(); got != c.want {
			t.Errorf("window %v, ack timeout %v: bound %v, want %v", c.window, c.ack, got, c.want)
		}
	}
}
