package amqpsink_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
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

// publishOf is sinktest.Publish for a goroutine other than the test's.
func publishOf(sink relay.Sink, timeout time.Duration, msgs []*relay.Message) ([]error, string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	results := make([]error, len(msgs))
	sink.Publish(ctx, msgs, results)
	return results, ""
}
