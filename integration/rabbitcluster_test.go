package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// clusterNodes is how many RabbitMQ nodes the cluster test runs: three, so
// a quorum queue keeps its majority when one is killed.
const clusterNodes = 3

// A 3-node RabbitMQ cluster of the test's own, the legacy queue a quorum
// queue whose leader is on the first node, relayd in dual write and a
// backfill of a second quorum queue (delivery limit 1), both given all
// three node URLs with the first node first. Under producer load the first
// node is SIGKILLed: relayd and the backfill reconnect to another node and
// go on, relayd never exits. (relayd's new channel, opened before the
// queue's new leader was elected, is nacked everything by RabbitMQ 3.10:
// relayd replaces that connection after 2 × RELAY_PUBLISH_TIMEOUT.) Every committed row is in the stream once and
// in the quorum queue at least once, RabbitMQ's duplicates within the one
// connection loss's bound (the rows in flight: RELAY_WORKERS ×
// RELAY_BATCH_SIZE); every legacy message is in the stream once and none
// is left in its queue, though those the backfill held at the kill came
// back to it once (x-delivery-count 1).
func TestRabbitMQClusterNodeLoss(t *testing.T) {
	t.Parallel()
	c := testenv.NewRabbitCluster(t, clusterNodes)
	t.Logf("%d RabbitMQ nodes started and joined in %v", clusterNodes, c.Started.Round(100*time.Millisecond))
	victim, rest := c.Nodes[0], c.Nodes[1:]
	e := newEnvAt(t, rest[len(rest)-1].URL, testenv.NATSURL(t)) // the test reads through a node that stays
	legacyQ := e.queue + "_legacy"
	declareQuorum(t, victim.URL, e.exchange, e.queue, "orders.#", nil)
	declareQuorum(t, victim.URL, e.exchange, legacyQ, "legacy.#", amqp.Table{"x-delivery-limit": int32(1)})
	e.amqpURL = c.URLs(c.Nodes...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- what %s says ---\n%s", rest[0].Name, rest[0].Report())
		}
	})

	const legacyN = 2500
	var legacy []amqp.Publishing
	for i := range legacyN {
		legacy = append(legacy, amqp.Publishing{MessageId: fmt.Sprintf("legacy-%05d", i), Body: []byte("old"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(legacy, "legacy.old")

	r := startFaultRelay(e, "relay", "RELAY_PUBLISH_TIMEOUT=2s")
	victimAt := "node=" + hostOf(t, victim.URL)
	if out := r.out.String(); !strings.Contains(out, `msg="amqp connected" target=amqp `+victimAt) {
		t.Fatalf("relayd did not connect to the first node (%s):\n%s", victimAt, out)
	}
	load := startFaultLoad(e, 2, 0, 10, 10*time.Millisecond, faultSeed(t))
	bf, bfOut, bfDone := e.startBackfill(t, "", "--queue", legacyQ, "--rate", "500") // slow, so the kill comes mid-run
	testenv.Eventually(t, 30*time.Second, func() bool { _, a, n := e.counts(); return a > 300 && n > 300 }, "no progress before the kill")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.subjectCount(e.prefix+"legacy.old") >= 300 },
		"the backfill moved nothing before the kill:\n%v", lazyString(bfOut.String))
	if out := bfOut.String(); !strings.Contains(out, `msg="backfill: connected to RabbitMQ" `+victimAt) {
		t.Fatalf("the backfill did not connect to the first node (%s):\n%s", victimAt, out)
	}

	_, a0, _ := e.counts()
	killed := time.Now()
	victim.Kill()
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(r.out.String(), `msg="amqp reconnected"`) },
		"relayd did not reconnect after the kill")
	reconnected := time.Since(killed)
	testenv.Eventually(t, 30*time.Second, func() bool { _, a, _ := e.counts(); return a > a0+300 },
		"RabbitMQ deliveries did not resume after the kill")
	resumed := time.Since(killed)
	t.Logf("node killed with %d rows confirmed by RabbitMQ: relayd reconnected after %v, 300 more rows confirmed after %v",
		a0, reconnected.Round(time.Millisecond), resumed.Round(time.Millisecond))
	if out := r.out.String(); strings.Contains(out, `msg="amqp reconnected" target=amqp `+victimAt) {
		t.Errorf("relayd reconnected to the killed node:\n%s", out)
	}

	committed := load.wait()
	e.waitDelivered(60 * time.Second)
	if !r.running() {
		t.Fatalf("relayd exited:\n%s", r.out.String())
	}
	// The killed node's consumer stays on the quorum queue (RabbitMQ holds
	// it as suspected down until the node is back): the backfill, having
	// moved everything, does not call the queue drained while another
	// consumer is attached, and says so. Stopped, it ends cleanly.
	testenv.Eventually(t, 60*time.Second, func() bool {
		out := bfOut.String()
		return strings.Contains(out, "another consumer is on the queue") || strings.Contains(out, `"moved"`)
	}, "the backfill neither finished nor waited for the killed node's consumer:\n%v", lazyString(bfOut.String))
	bf.Process.Signal(syscall.SIGINT) //nolint:errcheck // it may have finished by itself
	sum := finished(t, bfDone, bfOut, 30*time.Second, "backfill across the node loss")
	t.Logf("backfill: %+v", sum)

	stream := e.streamIDs()
	queue := e.queueIDs(time.Second)
	all := map[string]bool{}
	for id := range committed {
		all[id] = true
	}
	for _, m := range legacy {
		all[m.MessageId] = true
	}
	if m, x, d := tally(all, stream); m > 0 || x > 0 || d > 0 {
		t.Errorf("jetstream: %d committed rows and %d legacy messages: %d missing, %d not committed, %d duplicates", len(committed), legacyN, m, x, d)
	}
	m, x, dupes := tally(committed, queue)
	if m > 0 || x > 0 {
		t.Errorf("rabbitmq quorum queue: %d committed rows, %d distinct ids received: %d missing, %d not committed", len(committed), len(queue), m, x)
	}
	if dupes > inFlightBound {
		t.Errorf("rabbitmq: %d duplicates after one connection loss, want at most the rows in flight (%d)", dupes, inFlightBound)
	}
	if n, consumers := e.queueDepth(legacyQ); n != 0 || consumers > 1 {
		t.Errorf("legacy queue: %d messages, %d consumers after the backfill; want empty, and at most the killed node's consumer", n, consumers)
	}
	redelivered := e.redelivered(e.prefix + "legacy.old")
	t.Logf("%d rows committed: %d lost in the quorum queue, %d duplicates there (bound %d); %d legacy messages in the stream once each, %d of them moved after coming back to the queue at the kill (x-delivery-count 1)",
		len(committed), m, dupes, inFlightBound, legacyN, redelivered)
	if !strings.Contains(bfOut.String(), `msg="backfill: reconnecting to RabbitMQ"`) {
		t.Errorf("the backfill did not lose its connection at the kill:\n%s", bfOut.String())
	}
}

// declareQuorum replaces queue (if there) by a durable quorum queue with
// args, declared through the node at rawURL (which so leads it), bound to
// exchange with key.
func declareQuorum(t *testing.T, rawURL, exchange, queue, key string, args amqp.Table) {
	t.Helper()
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	qargs := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range args {
		qargs[k] = v
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, qargs); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
}

// subjectCount is how many messages the stream holds on subject.
func (e *env) subjectCount(subject string) uint64 {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// redelivered is how many of the stream's messages on subject carry an
// x-delivery-count header above 0: a quorum queue had them back once.
func (e *env) redelivered(subject string) int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	want := int(e.subjectCount(subject))
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for got := 0; got < want; {
		batch, err := cons.Fetch(min(1000, want-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			e.t.Fatal(err)
		}
		k := 0
		for m := range batch.Messages() {
			if c := m.Headers().Get("x-delivery-count"); c != "" && c != "0" {
				n++
			}
			k++
		}
		if k == 0 {
			e.t.Fatalf("read %s: %d of %d", subject, got, want)
		}
		got += k
	}
	return n
}
