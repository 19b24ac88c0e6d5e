package amqpsink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/sinktest"
)

// Every goroutine started here (sinks, amqp091 connections, the queue
// readers) must be gone when the tests end, with one exception owned by
// toxiproxy v2.5.0: when Proxy.Stop closes a connection while bytes are in
// flight, the link's write goroutine exits on the write error and nothing
// drains the link's channels any more, so its read goroutine (blocked in
// stream.(*ChanWriter).Write) and its toxic stub (blocked in
// toxics.(*NoopToxic).Pipe) stay blocked on a channel send for good
// (toxiproxy link.go read/write, toxics/toxic.go Run). Both are toxiproxy's
// own pipeline goroutines, started by ToxicLink.Start, never ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
	)
}

func TestConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		New:     func(t *testing.T) (relay.Sink, sinktest.Broker) { e := setup(t); return e.sink, e },
		Dedupes: false, // RabbitMQ never dedupes: a retried message is queued again
	})
}

// A batch mixing routable messages with ones no queue is bound to: the
// routable ones are confirmed and arrive; the others are returned, never
// confirmed, never queued.
func TestUnroutableIsReturned(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	msgs := sinktest.Messages("mixed", 30)
	unroutable := makeUnroutable(msgs, func(i int) bool { return i%3 == 1 })
	results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
	requireRouting(t, msgs, results, unroutable)

	var routed []*relay.Message
	for _, m := range msgs {
		if !unroutable[m.MessageID] {
			routed = append(routed, m)
		}
	}
	sinktest.WaitArrived(t, e, routed)
	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), routed, 1)
}

// An unroutable message is warned of in the log by the time its publish
// returns — naming the topic, the exchange and the fix — not only when its
// row is parked; its repeats within the rate limit add no line.
func TestUnroutableIsWarnedOfAtOnce(t *testing.T) {
	t.Parallel()
	var log lockedBuffer
	e := setupReadyWith(t, func(c *amqpsink.Config) { c.Logger = slog.New(slog.NewJSONHandler(&log, nil)) })
	warnings := func() []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["level"] == "WARN" && strings.Contains(fmt.Sprint(rec["msg"]), "unroutable") {
				out = append(out, rec)
			}
		}
		return out
	}
	msgs := sinktest.Messages("warn", 3)
	makeUnroutable(msgs, func(int) bool { return true })
	requireRouting(t, msgs[:1], sinktest.Publish(t, e.sink, 20*time.Second, msgs[:1]), map[string]bool{msgs[0].MessageID: true})
	w := warnings()
	if len(w) != 1 {
		t.Fatalf("after one unroutable publish returned: %d warnings, want 1\n%s", len(w), log.String())
	}
	if w[0]["topic"] != msgs[0].Topic || w[0]["exchange"] != e.exchange || !strings.Contains(fmt.Sprint(w[0]["msg"]), "Bind a queue") {
		t.Fatalf("warning %v: want topic %q, exchange %q and the fix (bind a queue)", w[0], msgs[0].Topic, e.exchange)
	}
	// The same topic again (the row's retries): rate-limited.
	again := []*relay.Message{msgs[1]}
	again[0].Topic = msgs[0].Topic
	sinktest.Publish(t, e.sink, 20*time.Second, again)
	if n := len(warnings()); n != 1 {
		t.Fatalf("after a second return of the same topic: %d warnings, want still 1", n)
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Returns and confirms of concurrent publishes are paired with the right
// message: 8 goroutines, each a batch with every third message unroutable.
func TestConcurrentReturns(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	var wg sync.WaitGroup
	for w := range 8 {
		msgs := sinktest.Messages(fmt.Sprintf("cret%d", w), 150)
		unroutable := makeUnroutable(msgs, func(i int) bool { return (i+w)%3 == 0 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			results := make([]error, len(msgs))
			e.sink.Publish(ctx, msgs, results)
			requireRouting(t, msgs, results, unroutable)
		}()
	}
	wg.Wait()
}

// makeUnroutable gives the messages pick chooses a topic no queue is bound to
// (the queue binds sinktest.# only) and returns their ids.
func makeUnroutable(msgs []*relay.Message, pick func(i int) bool) map[string]bool {
	unroutable := map[string]bool{}
	for i, m := range msgs {
		if pick(i) {
			m.Topic = "unbound." + m.Topic
			unroutable[m.MessageID] = true
		}
	}
	return unroutable
}

func requireRouting(t *testing.T, msgs []*relay.Message, results []error, unroutable map[string]bool) {
	t.Helper()
	for i, m := range msgs {
		err := results[i]
		switch {
		case unroutable[m.MessageID] && !errors.Is(err, amqpsink.ErrReturned):
			t.Errorf("unroutable message %s (topic %q): result %v, want an error wrapping amqpsink.ErrReturned", m.MessageID, m.Topic, err)
		case unroutable[m.MessageID] && errors.Is(err, relay.ErrUnavailable):
			t.Errorf("unroutable message %s: result %v also wraps ErrUnavailable", m.MessageID, err)
		case !unroutable[m.MessageID] && err != nil:
			t.Errorf("routable message %s (topic %q): result %v, want nil", m.MessageID, m.Topic, err)
		}
	}
}

// A queue that is full and refuses new messages (x-overflow
// reject-publish) has RabbitMQ nack them. A nack is amqpsink.ErrNacked: a
// per-message failure, which counts as one of the row's attempts — not an
// outage, not relay.ErrOutOfRoom — because a message routed to several
// queues is in the others already, nacked or not (here: the test's queue
// got all five), and every publish again adds a copy there. Once the queue
// has room, the same messages are confirmed.
func TestNackFromAFullQueue(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	ch := testenv.ConfirmChannel(t) // the test's own: declares, binds, purges
	full := e.queue + "_full"
	if _, err := ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	defer ch.QueueDelete(full, false, false, false) //nolint:errcheck // the test's own queue
	if err := ch.QueueBind(full, sinktest.TopicPrefix+"full.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	msgs := sinktest.Messages("full", 5)
	// One batch each, in order: which two of a batch the queue takes would
	// be RabbitMQ's choice.
	for i, m := range msgs {
		err := sinktest.Publish(t, e.sink, 20*time.Second, []*relay.Message{m})[0]
		switch {
		case i < 2 && err != nil:
			t.Fatalf("message %d, queue not full yet: %v", i, err)
		case i >= 2 && (!errors.Is(err, amqpsink.ErrNacked) || errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrOutOfRoom) || relay.IsPermanent(err)):
			t.Errorf("message %d into the full queue: %v, want amqpsink.ErrNacked alone", i, err)
		}
	}
	sinktest.WaitArrived(t, e, msgs) // the test's queue took them all
	if _, err := ch.QueuePurge(full, false); err != nil {
		t.Fatal(err)
	}
	sinktest.RequireAllNil(t, msgs[2:4], sinktest.Publish(t, e.sink, 20*time.Second, msgs[2:4]))
}

// A routing key over AMQP's 255-byte limit is permanent; the batch's other
// messages are published.
func TestLongRoutingKeyIsPermanent(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	msgs := sinktest.Messages("longkey", 3)
	msgs[1].Topic = sinktest.TopicPrefix + strings.Repeat("k", 256-len(sinktest.TopicPrefix))
	results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
	var pe *relay.PermanentError
	if !errors.As(results[1], &pe) {
		t.Fatalf("routing key of %d bytes: result %v (%T), want a *relay.PermanentError", len(msgs[1].Topic), results[1], results[1])
	}
	ok := []*relay.Message{msgs[0], msgs[2]}
	sinktest.RequireAllNil(t, ok, []error{results[0], results[2]})
	sinktest.WaitArrived(t, e, ok)
}

// A header RabbitMQ cannot take — a key over 255 bytes, or a content-type or
// correlation-id value over 255 bytes (an AMQP short string) — is permanent.
// amqp091-go would find out only while writing the frames and close the
// connection, failing every publish on it, batch after batch.
func TestHeaderOverShortStringIsPermanent(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	long := strings.Repeat("a", 256)
	for name, h := range map[string]map[string]string{
		"key of 256 bytes":            {long: "v"},
		"content-type of 256 bytes":   {"content-type": long},
		"Correlation-Id of 256 bytes": {"Correlation-Id": long},
	} {
		msgs := sinktest.Messages("shortstr", 3)
		msgs[1].Headers = h
		results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
		var pe *relay.PermanentError
		if !errors.As(results[1], &pe) || errors.Is(results[1], relay.ErrUnavailable) {
			t.Fatalf("%s: result %v (%T), want a *relay.PermanentError", name, results[1], results[1])
		}
		ok := []*relay.Message{msgs[0], msgs[2]}
		sinktest.RequireAllNil(t, ok, []error{results[0], results[2]})
		sinktest.WaitArrived(t, e, ok)
	}
	// Headers whose field table does not fit one frame (frame_max, 128 KiB
	// by default): amqp091-go splits only the body into frames, and RabbitMQ
	// closes the connection on a content header over frame_max.
	msgs := sinktest.Messages("bigheaders", 3)
	msgs[1].Headers = map[string]string{"x-a": strings.Repeat("a", 70_000), "x-b": strings.Repeat("b", 70_000)}
	results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
	var pe *relay.PermanentError
	if !errors.As(results[1], &pe) || errors.Is(results[1], relay.ErrUnavailable) {
		t.Fatalf("headers of 140,000 bytes: result %v (%T), want a *relay.PermanentError", results[1], results[1])
	}
	ok := []*relay.Message{msgs[0], msgs[2]}
	sinktest.RequireAllNil(t, ok, []error{results[0], results[2]})
	sinktest.WaitArrived(t, e, ok)

	// A long value in any other header fits a field table (a long string).
	msgs = sinktest.Messages("longstr", 1)
	msgs[0].Headers = map[string]string{"x-note": strings.Repeat("a", 4096)}
	sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 20*time.Second, msgs))
	sinktest.WaitArrived(t, e, msgs)
}

// writeCounter counts the writes that reach a connection's socket, and
// fails them while fail is set.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
	fail   *atomic.Bool
}

func (c writeCounter) Write(p []byte) (int, error) {
	if c.fail != nil && c.fail.Load() {
		return 0, errors.New("test: write refused")
	}
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A batch's publishes reach the socket in a few writes, not one each: at a
// few rows a batch, a write per publish was the relay's largest cost.
func TestBatchLeavesInFewWrites(t *testing.T) {
	t.Parallel()
	var writes atomic.Int64
	e := setupWrapped(t, func(c net.Conn) net.Conn { return writeCounter{Conn: c, writes: &writes} })
	for _, n := range []int{1, 5, 200} {
		msgs := sinktest.Messages(fmt.Sprintf("cork%d", n), n)
		before := writes.Load()
		sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 20*time.Second, msgs))
		// 200 messages of about 1.1 KiB: one write at the cork's 128 KiB,
		// one at the end. A heartbeat may add one.
		if got, most := writes.Load()-before, int64(3+n/100); got > most {
			t.Errorf("%d publishes took %d writes, want at most %d", n, got, most)
		}
		sinktest.WaitArrived(t, e, msgs)
	}
}

// writeRecorder keeps a copy of every byte written to the connection.
type writeRecorder struct {
	net.Conn
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (c writeRecorder) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// A row without headers goes out with at most 64 bytes of AMQP properties
// (the property flags and list of its content header frame). RabbitMQ
// keeps a message's properties as one Erlang binary; past 64 bytes it lives
// off the process heap, reference-counted, and RabbitMQ then spent 20–25 %
// more CPU per message and confirmed 20–25 % fewer a second (a throwaway
// publisher, 100,000 persistent 1 KiB messages, 2,000 in flight: a UUID
// message-id and a timestamp alone, 12,900–15,200/s; with content type
// "application/octet-stream", 73 bytes, 10,300–11,300/s). The sink used to
// send that content type by default.
func TestPropertiesStaySmall(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var wire bytes.Buffer
	e := setupWrapped(t, func(c net.Conn) net.Conn { return writeRecorder{Conn: c, mu: &mu, buf: &wire} })
	msgs := sinktest.Messages("props", 1)
	msgs[0].Headers = nil
	msgs[0].MessageID = "6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b10" // a UUID, as the outbox gives
	msgs[0].Payload = bytes.Repeat([]byte("x"), 1024)
	sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 20*time.Second, msgs))

	mu.Lock()
	b := bytes.Clone(wire.Bytes())
	mu.Unlock()
	b = bytes.TrimPrefix(b, []byte("AMQP\x00\x00\x09\x01"))
	var headers []int // property bytes of each content header frame
	for len(b) >= 8 {
		size := int(b[3])<<24 | int(b[4])<<16 | int(b[5])<<8 | int(b[6])
		if len(b) < 8+size {
			t.Fatalf("truncated frame: %d of %d bytes", len(b)-8, size)
		}
		if b[0] == 2 { // content header: class, weight, body size (12 bytes), then flags and properties
			headers = append(headers, size-12)
		}
		b = b[8+size:]
	}
	if len(headers) != 1 {
		t.Fatalf("%d content headers on the wire, want 1", len(headers))
	}
	if headers[0] > 64 {
		t.Errorf("a row without headers has %d bytes of AMQP properties, want at most 64", headers[0])
	}
	want := amqpsink.Publishing(msgs[0])
	if want.ContentType != "" || want.MessageId != msgs[0].MessageID || want.Timestamp.IsZero() || want.DeliveryMode != amqp.Persistent {
		t.Errorf("properties of a row without headers: content type %q, message-id %q, timestamp %v, delivery mode %d",
			want.ContentType, want.MessageId, want.Timestamp, want.DeliveryMode)
	}
}

// A corked batch whose write fails ends as unknown at once, not at the
// publish timeout, and the sink reconnects and delivers the retry.
func TestFailedFlushIsUnknown(t *testing.T) {
	t.Parallel()
	var writes atomic.Int64
	var fail atomic.Bool
	e := setupWrapped(t, func(c net.Conn) net.Conn { return writeCounter{Conn: c, writes: &writes, fail: &fail} })
	msgs := sinktest.Messages("flushfail", 20)
	fail.Store(true)
	start := time.Now()
	results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("failed flush resolved after %v, want at once", took)
	}
	sinktest.RequireAllUnavailable(t, msgs, results)
	fail.Store(false)
	// As the relay does: publish again until confirmed (the sink may not
	// have noticed the lost connection yet: unknown again).
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, err := range sinktest.Publish(t, e.sink, 20*time.Second, msgs) {
			if err != nil {
				return false
			}
		}
		return true
	}, "retry never confirmed")
	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), msgs, 1)
}

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

// env is one test's exchange and queue, a proxy in front of RabbitMQ that
// the sink connects through, and a reader of the queue. It is the
// sinktest.Broker.
type env struct {
	sink     *amqpsink.Sink
	proxy    *toxiproxy.Proxy
	exchange string
	queue    string

	mu  sync.Mutex
	got map[string][]sinktest.Delivery
}

var _ sinktest.Broker = (*env)(nil)

func setup(t *testing.T) *env { t.Helper(); return setupWith(t, nil) }

// setupWith is setup with the sink's Config adjusted by tune.
func setupWith(t *testing.T, tune func(*amqpsink.Config)) *env {
	t.Helper()
	return setupAt(t, testenv.AMQPURL(t), tune)
}

// setupAt is setupWith on the RabbitMQ at rawURL.
func setupAt(t *testing.T, rawURL string, tune func(*amqpsink.Config)) *env {
	t.Helper()
	name := testenv.Name("sinktest")
	e := &env{exchange: name, queue: name + "_q", got: map[string][]sinktest.Delivery{}}

	// The reader connects directly, so Down does not touch it.
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		t.Fatalf("amqp dial: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(e.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(e.queue, sinktest.TopicPrefix+"#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(e.queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for d := range deliveries {
			e.add(d)
		}
	}()
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(e.queue, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", e.queue, err)
		}
		if err := ch.ExchangeDelete(e.exchange, false, false); err != nil {
			t.Errorf("delete exchange %s: %v", e.exchange, err)
		}
		conn.Close()
		<-readerDone
	})

	// The sink connects through a proxy of its own, which Down stops.
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	e.proxy = toxiproxy.NewProxy(srv, name, "127.0.0.1:0", u.Host)
	if err := e.proxy.Start(); err != nil {
		t.Fatalf("start proxy: %v", err)
	}
	t.Cleanup(e.proxy.Stop)
	u.Host = e.proxy.Listen // the port it got; kept across Stop/Start

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := amqpsink.Config{URL: u.String(), Exchange: e.exchange}
	if tune != nil {
		tune(&cfg)
	}
	e.sink, err = amqpsink.New(ctx, cfg)
	if err != nil {
		t.Fatalf("amqpsink.New: %v", err)
	}
	t.Cleanup(func() {
		closed := make(chan struct{})
		go func() { e.sink.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Errorf("Sink.Close did not return within 30s")
		}
	})
	return e
}

// setupWrapped is setupReady with every connection the sink dials wrapped
// by wrap, below the cork (wrap's conn sees the writes that reach the
// socket).
func setupWrapped(t *testing.T, wrap func(net.Conn) net.Conn) *env {
	t.Helper()
	return setupReadyWith(t, func(c *amqpsink.Config) { amqpsink.WrapConn(c, wrap) })
}

// setupReady is setup, then waits for the sink to be Ready, for the tests
// of what comes after; the conformance suite's ReadyAfterNew checks that it
// is Ready at once.
func setupReady(t *testing.T) *env { t.Helper(); return setupReadyWith(t, nil) }

// setupReadyWith is setupWith, then waits for the sink to be Ready.
func setupReadyWith(t *testing.T, tune func(*amqpsink.Config)) *env {
	t.Helper()
	return setupReadyAt(t, testenv.AMQPURL(t), tune)
}

// setupReadyAt is setupAt, then waits for the sink to be Ready.
func setupReadyAt(t *testing.T, rawURL string, tune func(*amqpsink.Config)) *env {
	t.Helper()
	e := setupAt(t, rawURL, tune)
	testenv.Eventually(t, 5*time.Second, func() bool { return e.sink.Ready() == nil }, "sink never Ready")
	return e
}

// lateConfirms records the ids sink reports to OnLateConfirm; it returns
// how many it has.
func lateConfirms(sink *amqpsink.Sink) func() int {
	var mu sync.Mutex
	late := map[string]bool{}
	sink.OnLateConfirm(func(id string) {
		mu.Lock()
		defer mu.Unlock()
		late[id] = true
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(late)
	}
}

func (e *env) add(d amqp.Delivery) {
	h := make(map[string]string, len(d.Headers))
	for k, v := range d.Headers {
		h[k] = fmt.Sprint(v)
	}
	e.mu.Lock()
	e.got[d.MessageId] = append(e.got[d.MessageId], sinktest.Delivery{Headers: h, Payload: d.Body})
	e.mu.Unlock()
}

// Received implements sinktest.Broker: what the queue's consumer got.
func (e *env) Received(t *testing.T) map[string][]sinktest.Delivery {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string][]sinktest.Delivery, len(e.got))
	for id, ds := range e.got {
		out[id] = append([]sinktest.Delivery(nil), ds...)
	}
	return out
}

// Down implements sinktest.Broker: the proxy closes its listener and every
// connection through it.
func (e *env) Down(t *testing.T) { e.proxy.Stop() }

// Up implements sinktest.Broker: the proxy listens on its port again.
func (e *env) Up(t *testing.T) {
	t.Helper()
	if err := e.proxy.Start(); err != nil {
		t.Fatalf("restart proxy on %s: %v", e.proxy.Listen, err)
	}
}

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

// publishOf is sinktest.Publish for a goroutine other than the test's.
func publishOf(sink relay.Sink, timeout time.Duration, msgs []*relay.Message) ([]error, string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	results := make([]error, len(msgs))
	sink.Publish(ctx, msgs, results)
	return results, ""
}
