package amqpsink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/sinktest"
)

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
	var log testenv.SyncBuffer
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
		case unroutable[m.MessageID] && !errors.Is(err, relay.ErrReturned):
			t.Errorf("unroutable message %s (topic %q): result %v, want an error wrapping relay.ErrReturned", m.MessageID, m.Topic, err)
		case unroutable[m.MessageID] && errors.Is(err, relay.ErrUnavailable):
			t.Errorf("unroutable message %s: result %v also wraps ErrUnavailable", m.MessageID, err)
		case !unroutable[m.MessageID] && err != nil:
			t.Errorf("routable message %s (topic %q): result %v, want nil", m.MessageID, m.Topic, err)
		}
	}
}

// A queue that is full and refuses new messages (x-overflow
// reject-publish) has RabbitMQ nack them. A nack is relay.ErrNacked: a
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
		case i >= 2 && (!errors.Is(err, relay.ErrNacked) || errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrOutOfRoom) || relay.IsPermanent(err)):
			t.Errorf("message %d into the full queue: %v, want relay.ErrNacked alone", i, err)
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

// A header RabbitMQ cannot take — a key over 255 bytes, or the value of one
// that sets an AMQP property over 255 bytes (an AMQP short string) — is
// permanent. amqp091-go would find out only while writing the frames and
// close the connection, failing every publish on it, batch after batch.
func TestHeaderOverShortStringIsPermanent(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	long := strings.Repeat("a", 256)
	for name, h := range map[string]map[string]string{
		"key of 256 bytes":            {long: "v"},
		"content-type of 256 bytes":   {"content-type": long},
		"Correlation-Id of 256 bytes": {"Correlation-Id": long},
		"reply-to of 256 bytes":       {"reply-to": long},
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

// A row's headers reach RabbitMQ as the legacy service's own publish of the
// message with amqp091-go: those naming a property as the property alone,
// the others in the headers table. A consumer cannot tell them apart.
func TestPropertiesAsALegacyPublisherSetsThem(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	ch := testenv.ConfirmChannel(t)
	queue := e.queue + "_legacy"
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer ch.QueueDelete(queue, false, false, false) //nolint:errcheck // the test's own queue
	topic := sinktest.TopicPrefix + "legacy.placed"
	if err := ch.QueueBind(queue, topic, e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	user := amqpUser(t)
	msg := sinktest.Messages("legacy", 1)[0]
	msg.Topic = topic
	msg.CreatedAt = time.Now().Truncate(time.Second) // AMQP timestamps are seconds
	msg.Headers = map[string]string{
		"Content-Type": "application/json", "content-encoding": "gzip", "correlation-id": "c-1", "reply-to": "replies",
		"expiration": "600000", "priority": "3", "type": "order.placed", "user-id": user, "app-id": "shop",
		"tenant": "acme", "traceparent": sinktest.Traceparent,
	}
	legacy := amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: msg.MessageID, Timestamp: msg.CreatedAt, Body: msg.Payload,
		ContentType: "application/json", ContentEncoding: "gzip", CorrelationId: "c-1", ReplyTo: "replies",
		Expiration: "600000", Priority: 3, Type: "order.placed", UserId: user, AppId: "shop",
		Headers: amqp.Table{"tenant": "acme", "traceparent": sinktest.Traceparent}}

	sinktest.RequireAllNil(t, []*relay.Message{msg}, sinktest.Publish(t, e.sink, 20*time.Second, []*relay.Message{msg}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, e.exchange, topic, false, false, legacy)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("legacy publish not confirmed: %v", err)
	}
	var got [2]amqp.Publishing // the relay's, the legacy service's
	for i := range got {
		var d amqp.Delivery
		testenv.Eventually(t, 10*time.Second, func() bool {
			var ok bool
			d, ok, err = ch.Get(queue, true)
			return ok || err != nil
		}, "message never in the queue")
		if err != nil {
			t.Fatal(err)
		}
		got[i] = amqp.Publishing{Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
			DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
			Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId,
			AppId: d.AppId, Body: d.Body}
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Errorf("the relay's message differs from the legacy publish:\n relay  %+v\n legacy %+v", got[0], got[1])
	}
}

// A row whose user-id is not the user the sink connects as is parked, and
// the rest of its batch is confirmed: RabbitMQ would have closed the
// channel on it (PRECONDITION_FAILED), failing every publish in flight.
func TestForeignUserIDIsParked(t *testing.T) {
	t.Parallel()
	e := setupReady(t)
	msgs := sinktest.Messages("userid", 3)
	msgs[0].Headers = map[string]string{"user-id": amqpUser(t)}
	msgs[1].Headers = map[string]string{"user-id": "not-" + amqpUser(t)}
	results := sinktest.Publish(t, e.sink, 20*time.Second, msgs)
	if !relay.IsPermanent(results[1]) {
		t.Fatalf("a foreign user-id: result %v, want permanent", results[1])
	}
	ok := []*relay.Message{msgs[0], msgs[2]}
	sinktest.RequireAllNil(t, ok, []error{results[0], results[2]})
	sinktest.WaitArrived(t, e, ok)
}

// amqpUser is the user the tests connect to RabbitMQ as.
func amqpUser(t *testing.T) string {
	t.Helper()
	u, err := amqp.ParseURI(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
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
