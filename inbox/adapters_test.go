package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/testenv"
)

// brokers is one test's queue, stream and durable JetStream consumer.
type brokers struct {
	t        *testing.T
	amqpURL  string
	natsURL  string
	conn     *amqp.Connection // for publishing and inspecting
	queue    string
	nc       *nats.Conn
	js       jetstream.JetStream
	stream   string
	prefix   string
	consumer string
}

// setupBrokers declares a queue and creates a stream with a durable pull
// consumer whose AckWait is ackWait; all are deleted when the test ends.
func setupBrokers(t *testing.T, ackWait time.Duration) *brokers {
	t.Helper()
	id := testenv.Name("inbox")
	b := &brokers{t: t, amqpURL: testenv.AMQPURL(t), natsURL: testenv.NATSURL(t),
		queue: id, stream: strings.ToUpper(id), prefix: id + ".", consumer: "c"}
	var err error
	if b.conn, err = amqp.Dial(b.amqpURL); err != nil {
		t.Fatalf("amqp dial: %v", err)
	}
	t.Cleanup(func() { b.conn.Close() })
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(b.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := b.conn.Channel(); err == nil {
			ch.QueueDelete(b.queue, false, false, false)
			ch.Close()
		}
	})

	if b.nc, err = nats.Connect(b.natsURL); err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(b.nc.Close)
	if b.js, err = jetstream.New(b.nc); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.prefix + ">"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() { b.js.DeleteStream(context.Background(), b.stream) })
	if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: b.consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	}); err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	return b
}

// publish sends msgs to the queue (persistent, confirmed) and the stream,
// like relayd: the same id on both, unless a message sets its own.
func (b *brokers) publishAMQP(msgs ...amqp.Publishing) {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	confs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		if confs[i], err = ch.PublishWithDeferredConfirmWithContext(ctx, "", b.queue, true, false, m); err != nil {
			b.t.Fatalf("amqp publish: %v", err)
		}
	}
	for _, c := range confs {
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			b.t.Fatalf("amqp publish not confirmed: %v", err)
		}
	}
}

func (b *brokers) publishNATS(msgs ...*nats.Msg) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range msgs {
		m.Subject = b.prefix + m.Subject
		if _, err := b.js.PublishMsg(ctx, m); err != nil {
			b.t.Fatalf("nats publish: %v", err)
		}
	}
}

// queueEmpty reports whether the queue has no ready messages and no
// consumers (so none unacked either).
func (b *brokers) queueEmpty() bool {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(b.queue, true, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages == 0 && q.Consumers == 0
}

// consumerDone reports whether the durable consumer has nothing pending and
// nothing awaiting an ack.
func (b *brokers) consumerDone() bool {
	b.t.Helper()
	c, err := b.js.Consumer(context.Background(), b.stream, b.consumer)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}

// amqpConsumer starts consuming the queue with manual acks on a channel of
// its own.
func (b *brokers) amqpConsumer(prefetch int) (*amqp.Channel, <-chan amqp.Delivery) {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		b.t.Fatal(err)
	}
	d, err := ch.Consume(b.queue, "", false, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return ch, d
}

func recv(t *testing.T, d <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case m, ok := <-d:
		if !ok {
			t.Fatal("deliveries closed")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
	}
	panic("unreachable")
}

func (b *brokers) fetch(timeout time.Duration) jetstream.Msg {
	b.t.Helper()
	c, err := b.js.Consumer(context.Background(), b.stream, b.consumer)
	if err != nil {
		b.t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(timeout))
	if err != nil {
		b.t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	return nil
}

// Two instances of a consumer each read the queue and the durable
// JetStream consumer while the same 500 ids are published to both (some
// upper-cased on RabbitMQ): every message's side effect happens exactly
// once, and every delivery on both brokers is acknowledged.
func TestDualReadTwoInstances(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := setupBrokers(t, 30*time.Second)
	reg := prometheus.NewRegistry()
	const n = 500
	ids := uuids(n)

	var acked [2]atomic.Int64 // amqp, nats
	var calls atomic.Int64
	var stops []func()
	for i := range 2 {
		name := fmt.Sprintf("instance%d", i)
		in := f.newInbox(inbox.Config{Registerer: reg})
		h := f.effect(name, &calls)

		conn, err := amqp.Dial(b.amqpURL)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Qos(50, 0, false); err != nil {
			t.Fatal(err)
		}
		deliveries, err := ch.Consume(b.queue, name, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		amqpDone := make(chan struct{})
		go func() {
			defer close(amqpDone)
			for d := range deliveries {
				if err := in.HandleAMQP(context.Background(), d, h); err != nil {
					t.Errorf("%s: HandleAMQP: %v", name, err)
					continue
				}
				acked[0].Add(1)
			}
		}()

		nc, err := nats.Connect(b.natsURL)
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := js.Consumer(context.Background(), b.stream, b.consumer)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			if err := in.HandleJetStream(context.Background(), msg, h); err != nil {
				t.Errorf("%s: HandleJetStream: %v", name, err)
				return
			}
			acked[1].Add(1)
		}, jetstream.PullMaxMessages(50))
		if err != nil {
			t.Fatal(err)
		}
		// Soft stop: stop receiving, finish what was received, then close.
		stops = append(stops, func() {
			cc.Stop()
			<-cc.Closed()
			nc.Close()
			if err := ch.Cancel(name, false); err != nil {
				t.Errorf("%s: cancel: %v", name, err)
			}
			<-amqpDone
			ch.Close()
			conn.Close()
		})
	}
	stopAll := sync.OnceFunc(func() {
		for _, stop := range stops {
			stop()
		}
	})
	t.Cleanup(stopAll)

	// Publish to both brokers at once, as relayd does.
	var pub sync.WaitGroup
	pub.Add(2)
	go func() {
		defer pub.Done()
		msgs := make([]amqp.Publishing, n)
		for i, id := range ids {
			if i%5 == 0 {
				id = strings.ToUpper(id) // another producer's spelling
			}
			msgs[i] = amqp.Publishing{MessageId: id, Body: []byte(`{"i":` + fmt.Sprint(i) + `}`)}
		}
		b.publishAMQP(msgs...)
	}()
	go func() {
		defer pub.Done()
		msgs := make([]*nats.Msg, n)
		for i, id := range ids {
			msgs[i] = &nats.Msg{Subject: "orders.created", Header: nats.Header{jetstream.MsgIDHeader: {id}}, Data: []byte(`{"i":` + fmt.Sprint(i) + `}`)}
		}
		b.publishNATS(msgs...)
	}()
	pub.Wait()

	testenv.Eventually(t, 30*time.Second, func() bool { return acked[0].Load() == n && acked[1].Load() == n },
		"want %d acked deliveries per broker", n)
	stopAll()
	f.checkOnce(ids)
	if calls.Load() != n {
		t.Errorf("handler called %d times, want %d", calls.Load(), n)
	}
	if acked[0].Load() != n || acked[1].Load() != n {
		t.Errorf("acked %d amqp and %d nats deliveries, want %d each (a redelivery?)", acked[0].Load(), acked[1].Load(), n)
	}
	processed := counter(t, reg, "relayd_inbox_processed_total", "amqp") + counter(t, reg, "relayd_inbox_processed_total", "nats")
	dupes := counter(t, reg, "relayd_inbox_duplicates_total", "amqp") + counter(t, reg, "relayd_inbox_duplicates_total", "nats")
	errs := counter(t, reg, "relayd_inbox_errors_total", "amqp") + counter(t, reg, "relayd_inbox_errors_total", "nats")
	if processed != n || dupes != n || errs != 0 {
		t.Errorf("metrics: processed %v, duplicates %v, errors %v; want %d, %d, 0", processed, dupes, errs, n, n)
	}
	testenv.Eventually(t, 10*time.Second, b.queueEmpty, "queue not empty after the consumers stopped")
	testenv.Eventually(t, 10*time.Second, b.consumerDone, "JetStream consumer has pending or unacked messages")
}

// A consumer that committed but died before acking gets the message again;
// the redelivery is acknowledged without running the handler.
func TestAckLostAfterCommit(t *testing.T) {
	t.Parallel()
	t.Run("amqp", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		b := setupBrokers(t, 30*time.Second)
		in := f.newInbox(inbox.Config{})
		var calls atomic.Int64
		h := f.effect("a", &calls)
		id := uuids(1)[0]
		b.publishAMQP(amqp.Publishing{MessageId: id, Body: []byte("{}")})

		ch1, d1 := b.amqpConsumer(1)
		first := recv(t, d1)
		if p, err := in.Process(context.Background(), inbox.AMQPMessage(first), h); err != nil || !p {
			t.Fatalf("Process = %v, %v; want true, nil", p, err)
		}
		ch1.Close() // "killed" after the commit, before the ack: RabbitMQ requeues

		ch2, d2 := b.amqpConsumer(1)
		again := recv(t, d2)
		if !again.Redelivered || again.MessageId != id {
			t.Fatalf("second delivery: id %s, redelivered %v; want %s redelivered", again.MessageId, again.Redelivered, id)
		}
		if err := in.HandleAMQP(context.Background(), again, h); err != nil {
			t.Fatalf("HandleAMQP(redelivery): %v", err)
		}
		ch2.Close()
		if calls.Load() != 1 {
			t.Errorf("handler called %d times, want 1", calls.Load())
		}
		f.checkOnce([]string{id})
		testenv.Eventually(t, 10*time.Second, b.queueEmpty, "redelivery was not acked")
	})
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		b := setupBrokers(t, time.Second)
		in := f.newInbox(inbox.Config{})
		var calls atomic.Int64
		h := f.effect("a", &calls)
		id := uuids(1)[0]
		b.publishNATS(&nats.Msg{Subject: "orders.created", Header: nats.Header{jetstream.MsgIDHeader: {id}}, Data: []byte("{}")})

		first := b.fetch(5 * time.Second)
		if first == nil {
			t.Fatal("no message")
		}
		if p, err := in.Process(context.Background(), inbox.JetStreamMessage(first), h); err != nil || !p {
			t.Fatalf("Process = %v, %v; want true, nil", p, err)
		}
		// Not acked: the server redelivers after AckWait (1s).
		again := b.fetch(10 * time.Second)
		if again == nil {
			t.Fatal("not redelivered after AckWait")
		}
		md, err := again.Metadata()
		if err != nil || md.NumDelivered != 2 || again.Headers().Get(jetstream.MsgIDHeader) != id {
			t.Fatalf("second delivery: %+v, %v; want delivery 2 of %s", md, err, id)
		}
		if err := in.HandleJetStream(context.Background(), again, h); err != nil {
			t.Fatalf("HandleJetStream(redelivery): %v", err)
		}
		if calls.Load() != 1 {
			t.Errorf("handler called %d times, want 1", calls.Load())
		}
		f.checkOnce([]string{id})
		testenv.Eventually(t, 10*time.Second, b.consumerDone, "redelivery was not acked")
	})
}

// A handler error leaves no side effect; the broker redelivers (JetStream
// after the backoff) and the message is processed once.
func TestHandlerErrorRedelivered(t *testing.T) {
	t.Parallel()
	failOnce := func(f *fixture, calls *atomic.Int64) inbox.Handler {
		ok := f.effect("a", calls)
		return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if err := ok(ctx, tx, m); err != nil {
				return err
			}
			if calls.Load() == 1 {
				return errBoom
			}
			return nil
		}
	}
	t.Run("amqp", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		b := setupBrokers(t, 30*time.Second)
		in := f.newInbox(inbox.Config{})
		var calls atomic.Int64
		h := failOnce(f, &calls)
		id := uuids(1)[0]
		b.publishAMQP(amqp.Publishing{MessageId: id, Body: []byte("{}")})

		ch, d := b.amqpConsumer(1)
		if err := in.HandleAMQP(context.Background(), recv(t, d), h); !errors.Is(err, errBoom) {
			t.Fatalf("HandleAMQP with a failing handler = %v, want errBoom", err)
		}
		if n := len(f.sideCounts()); n != 0 {
			t.Fatalf("%d side effects after the handler failed, want 0", n)
		}
		again := recv(t, d)
		if !again.Redelivered {
			t.Fatal("second delivery not marked redelivered")
		}
		if err := in.HandleAMQP(context.Background(), again, h); err != nil {
			t.Fatalf("HandleAMQP(redelivery): %v", err)
		}
		ch.Close()
		if calls.Load() != 2 {
			t.Errorf("handler called %d times, want 2", calls.Load())
		}
		f.checkOnce([]string{id})
		testenv.Eventually(t, 10*time.Second, b.queueEmpty, "queue not empty")
	})
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		b := setupBrokers(t, 30*time.Second) // redelivery comes from the Nak, not AckWait
		const retryMin = 300 * time.Millisecond
		in := f.newInbox(inbox.Config{RetryMin: retryMin})
		var calls atomic.Int64
		h := failOnce(f, &calls)
		id := uuids(1)[0]
		b.publishNATS(&nats.Msg{Subject: "orders.created", Header: nats.Header{jetstream.MsgIDHeader: {id}}, Data: []byte("{}")})

		if err := in.HandleJetStream(context.Background(), b.fetch(5*time.Second), h); !errors.Is(err, errBoom) {
			t.Fatalf("HandleJetStream with a failing handler = %v, want errBoom", err)
		}
		naked := time.Now()
		if n := len(f.sideCounts()); n != 0 {
			t.Fatalf("%d side effects after the handler failed, want 0", n)
		}
		again := b.fetch(10 * time.Second)
		if again == nil {
			t.Fatal("not redelivered after the Nak")
		}
		if waited := time.Since(naked); waited < retryMin-50*time.Millisecond {
			t.Errorf("redelivered %v after the Nak, want no sooner than RetryMin %v", waited, retryMin)
		}
		if md, err := again.Metadata(); err != nil || md.NumDelivered != 2 {
			t.Fatalf("second delivery: %+v, %v; want delivery 2", md, err)
		}
		if err := in.HandleJetStream(context.Background(), again, h); err != nil {
			t.Fatalf("HandleJetStream(redelivery): %v", err)
		}
		if calls.Load() != 2 {
			t.Errorf("handler called %d times, want 2", calls.Load())
		}
		f.checkOnce([]string{id})
		testenv.Eventually(t, 10*time.Second, b.consumerDone, "consumer has pending or unacked messages")
	})
}

// A message without a usable id is rejected (AMQP, no requeue) or
// terminated (JetStream) without running the handler, and never comes
// back; one with only the derived-id header is processed under that id.
func TestPoisonMessages(t *testing.T) {
	t.Parallel()
	t.Run("amqp", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		b := setupBrokers(t, 30*time.Second)
		reg := prometheus.NewRegistry()
		// Opt out of deriving ids: a message without one is poison.
		in := f.newInbox(inbox.Config{Registerer: reg, DeriveAMQPID: func(amqp.Delivery) string { return "" }})
		var calls atomic.Int64
		h := f.effect("a", &calls)
		b.publishAMQP(
			amqp.Publishing{Body: []byte("no id")},
			amqp.Publishing{Body: []byte("derived"), Headers: amqp.Table{inbox.DerivedIDHeader: "derived-1"}},
			amqp.Publishing{Body: []byte("bad id"), Headers: amqp.Table{inbox.DerivedIDHeader: "bad\x00id"}},
		)
		ch, d := b.amqpConsumer(10)
		for _, want := range []error{inbox.ErrNoMessageID, nil, inbox.ErrInvalidMessageID} {
			m := recv(t, d)
			err := in.HandleAMQP(context.Background(), m, h)
			if !errors.Is(err, want) { // errors.Is(err, nil) means err == nil
				t.Errorf("HandleAMQP(%q) = %v, want %v", m.Body, err, want)
			}
		}
		ch.Close() // anything unacked or requeued would be back in the queue now
		testenv.Eventually(t, 10*time.Second, b.queueEmpty, "a rejected message is back in the queue")
		if calls.Load() != 1 {
			t.Errorf("handler called %d times, want 1 (for the derived id only)", calls.Load())
		}
		f.checkOnce([]string{"derived-1"})
		if got := counter(t, reg, "relayd_inbox_errors_total", "amqp"); got != 2 {
			t.Errorf("errors_total{amqp} = %v, want 2", got)
		}

		// By default a legacy message without any id gets the id the
		// backfill derives for it, so its two copies dedupe.
		in3 := f.newInbox(inbox.Config{Consumer: "default-derive"})
		legacy := amqp.Publishing{Body: []byte("legacy default"), ContentType: "text/plain"}
		b.publishAMQP(legacy)
		ch3, d3 := b.amqpConsumer(10)
		got := recv(t, d3)
		want := inbox.AMQPMessage(got).ID
		if err := in3.HandleAMQP(context.Background(), got, f.effect("default-derive", &calls)); err != nil {
			t.Fatalf("HandleAMQP with the default derivation: %v", err)
		}
		ch3.Close()
		if f.sideCounts()[want] != 1 {
			t.Errorf("message without id not processed under its derived id %s: %v", want, f.sideCounts())
		}

		// With DeriveAMQPID, a legacy message without any id gets one.
		in2 := f.newInbox(inbox.Config{Consumer: "derive", DeriveAMQPID: func(d amqp.Delivery) string { return "from-" + string(d.Body) }})
		b.publishAMQP(amqp.Publishing{Body: []byte("legacy")})
		ch, d = b.amqpConsumer(10)
		defer ch.Close()
		if err := in2.HandleAMQP(context.Background(), recv(t, d), f.effect("derive", &calls)); err != nil {
			t.Fatalf("HandleAMQP with DeriveAMQPID: %v", err)
		}
		if f.sideCounts()["from-legacy"] != 1 {
			t.Errorf("message without id not processed under the derived id: %v", f.sideCounts())
		}
	})
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		const ackWait = time.Second
		b := setupBrokers(t, ackWait)
		in := f.newInbox(inbox.Config{})
		var calls atomic.Int64
		h := f.effect("a", &calls)
		b.publishNATS(
			&nats.Msg{Subject: "orders.created", Data: []byte("no id")},
			&nats.Msg{Subject: "orders.created", Header: nats.Header{inbox.DerivedIDHeader: {"derived-1"}}, Data: []byte("derived")},
		)
		for _, want := range []error{inbox.ErrNoMessageID, nil} {
			m := b.fetch(5 * time.Second)
			if m == nil {
				t.Fatal("no message")
			}
			err := in.HandleJetStream(context.Background(), m, h)
			if !errors.Is(err, want) { // errors.Is(err, nil) means err == nil
				t.Errorf("HandleJetStream(%q) = %v, want %v", m.Data(), err, want)
			}
		}
		// A Term the server ignored would leave the message awaiting an ack.
		testenv.Eventually(t, 5*time.Second, b.consumerDone, "the terminated message is still pending")
		if m := b.fetch(ackWait + 500*time.Millisecond); m != nil {
			t.Fatalf("message %q redelivered after it was terminated", m.Data())
		}
		if calls.Load() != 1 {
			t.Errorf("handler called %d times, want 1 (for the derived id only)", calls.Load())
		}
		f.checkOnce([]string{"derived-1"})
	})
}

// A handler reads the same headers from either broker: what RabbitMQ
// carries as properties (a row's content-type, type …) comes back as the
// headers the JetStream copy has.
func TestAMQPMessageHeadersMatchJetStreams(t *testing.T) {
	d := amqp.Delivery{MessageId: "m-1", RoutingKey: "orders.created", ContentType: "application/json", Type: "OrderCreated",
		Priority: 5, Headers: amqp.Table{"x-tenant": "acme"}}
	got := inbox.AMQPMessage(d).Headers
	want := map[string]string{"x-tenant": "acme", "content-type": "application/json", "type": "OrderCreated", "priority": "5"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	if h := inbox.AMQPMessage(amqp.Delivery{MessageId: "m-2"}).Headers; h != nil {
		t.Errorf("a delivery without headers or properties gave headers %v", h)
	}
}

// An AMQP delivery's id is its message-id, else the Relay-Derived-Id
// header, else the id derived from its content: the one its backfilled
// JetStream copy carries (testdata/derived-ids.json, "worked example: every
// property and a body").
func TestAMQPMessageID(t *testing.T) {
	legacy := amqp.Delivery{RoutingKey: "orders.created", Timestamp: time.Date(2024, 3, 1, 12, 34, 56, 0, time.UTC),
		Type: "order.created", CorrelationId: "c-42", ContentType: "application/json", Body: []byte(`{"order":42}`)}
	withHeader, withBoth := legacy, legacy
	withHeader.Headers = amqp.Table{inbox.DerivedIDHeader: "derived-1"}
	withBoth.Headers, withBoth.MessageId = withHeader.Headers, "m-1"
	for _, tc := range []struct {
		name string
		d    amqp.Delivery
		want string
	}{
		{"message-id first", withBoth, "m-1"},
		{"then the header", withHeader, "derived-1"},
		{"then derived", legacy, "1855623d-0ea9-8201-90dd-4cfc1b9175c5"},
	} {
		if got := inbox.AMQPMessage(tc.d).ID; got != tc.want {
			t.Errorf("%s: id %q, want %q", tc.name, got, tc.want)
		}
	}
}
