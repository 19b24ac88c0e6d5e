package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// Per-key order end to end: 3 relay instances, 500 keys x 100 messages
// carrying a per-key sequence number, two relays SIGKILLed and restarted
// mid-run, NATS cut off for 10 s. In the stream every key's sequence is
// strictly increasing; in RabbitMQ it never goes back (a repeat only as the
// immediate re-send of a message in flight at a crash); nothing is lost.
func TestKeyOrderAcrossInstancesKillsAndOutage(t *testing.T) {
	t.Parallel()
	port, dir := freePort(t), t.TempDir()
	ns := startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	e := newEnv(t, fmt.Sprintf("nats://127.0.0.1:%d", port))
	ctx := context.Background()
	const keys, perKey = 500, 100
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.table.Ident()+` (topic, key, payload)
		SELECT 'orders.seq', 'k' || k, convert_to('k' || k || ':' || s, 'UTF8')
		FROM generate_series(1, $2::int) s, generate_series(1, $1::int) k ORDER BY s, k`, keys, perKey); err != nil {
		t.Fatal(err)
	}
	env := []string{"RELAY_PUBLISH_TIMEOUT=2s", "RELAY_RETRY_MIN=100ms", "RELAY_RETRY_MAX=1s"}
	relays := []*proc{e.startRelay("relay-1", env...), e.startRelay("relay-2", env...), e.startRelay("relay-3", env...)}
	total := keys * perKey
	progress := func(n int) {
		t.Helper()
		testenv.Eventually(t, 2*time.Minute, func() bool { _, a, _ := e.counts(); return a >= n }, "stuck below %d rows", n)
	}

	progress(total / 5)
	relays[0].kill()
	relays[0] = e.startRelay("relay-1b", env...)
	progress(2 * total / 5)
	ns.Shutdown()
	ns.WaitForShutdown()
	time.Sleep(10 * time.Second) // the NATS outage
	ns = startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	progress(3 * total / 5)
	relays[1].kill()
	relays[1] = e.startRelay("relay-2b", env...)
	e.waitDelivered(3 * time.Minute)

	parse := func(b []byte) (string, int) {
		k, s, _ := strings.Cut(string(b), ":")
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("payload %q", b)
		}
		return k, n
	}
	// The stream, in sequence order.
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	got := 0
	for got < total {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			k, seq := parse(m.Data())
			if seq <= last[k] {
				t.Fatalf("stream: key %s: %d after %d", k, seq, last[k])
			}
			last[k] = seq
			n++
		}
		if n == 0 {
			t.Fatalf("stream: %d of %d messages", got, total)
		}
		got += n
	}
	for k := 1; k <= keys; k++ {
		if last[fmt.Sprintf("k%d", k)] != perKey {
			t.Fatalf("stream: key k%d ends at %d, want %d", k, last[fmt.Sprintf("k%d", k)], perKey)
		}
	}

	// The queue, in delivery order (one consumer).
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ch.Qos(1000, 0, false)
	deliveries, err := ch.Consume(e.queue, "order-check", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	lastQ, repeats := map[string]int{}, 0
	for seen := 0; ; seen++ {
		select {
		case d := <-deliveries:
			k, seq := parse(d.Body)
			switch {
			case seq == lastQ[k]:
				repeats++ // the re-send of a message in flight at a crash
			case seq != lastQ[k]+1:
				t.Fatalf("rabbitmq: key %s: %d after %d", k, seq, lastQ[k])
			}
			lastQ[k] = seq
			continue
		case <-time.After(2 * time.Second):
		}
		break
	}
	for k := 1; k <= keys; k++ {
		if lastQ[fmt.Sprintf("k%d", k)] != perKey {
			t.Fatalf("rabbitmq: key k%d ends at %d, want %d", k, lastQ[fmt.Sprintf("k%d", k)], perKey)
		}
	}
	t.Logf("%d rows in order on both brokers; rabbitmq repeats (re-sends after the 2 kills): %d", total, repeats)
}
