package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// nodeExample is the directory of the Node example consumer, with its
// dependencies installed. It skips the test when node is not on PATH.
func nodeExample(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on PATH: the Node example consumer (examples/consumers/node) is not tested")
	}
	dir, err := filepath.Abs(filepath.Join("..", "examples", "consumers", "node"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		t.Fatalf("%s has no node_modules: run npm ci --prefix examples/consumers/node", dir)
	}
	return dir
}

// The example's derivation of a legacy message's id against the vectors the
// Go implementation pins (inbox/testdata/derived-ids.json).
func TestNodeExampleDerivesIDs(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("node", "--test")
	cmd.Dir = nodeExample(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test in %s: %v\n%s", cmd.Dir, err, out)
	}
}

// nodeConsumer is the Node example consumer of one test: its settings, and
// the process running it.
type nodeConsumer struct {
	e       *env
	dir     string
	env     []string
	durable string
	table   string // its handler's table: message_id, n (times run)
}

// start starts the consumer and waits until it reads both brokers.
func (c *nodeConsumer) start(name string) *proc {
	t := c.e.t
	t.Helper()
	cmd := exec.Command("node", "consumer.js")
	cmd.Dir, cmd.Env = c.dir, c.env
	p := startExec(t, name, cmd, nil)
	testenv.Eventually(t, 30*time.Second, func() bool {
		if !p.running() {
			t.Fatalf("%s exited at start: %v\n%s", name, p.err, p.out.String())
		}
		return strings.Contains(p.out.String(), "consuming queue")
	}, "%s did not start", name)
	return p
}

// in is c with t for its failures, and its env's: a subtest's helpers must
// fail the subtest, not its parent.
func (c *nodeConsumer) in(t *testing.T) *nodeConsumer {
	e := *c.e
	e.t = t
	d := *c
	d.e = &e
	return &d
}

// handled is how many ids the handler ran for: a count, cheap to poll.
func (c *nodeConsumer) handled() int {
	var n int
	if err := c.e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+c.table).Scan(&n); err != nil {
		c.e.t.Fatal(err)
	}
	return n
}

// settled reports whether the consumer ran want ids and both brokers have
// nothing left to deliver: no message ready in the queue, nothing pending
// or unacknowledged in the durable consumer. The queue's unacknowledged
// messages do not show while the consumer runs: once it stopped, they are
// ready again. It counts the ids first, and reads the brokers only then:
// Eventually calls it every 10ms.
func (c *nodeConsumer) settled(want int) bool {
	if c.handled() < want {
		return false
	}
	ci, err := c.e.js.Consumer(context.Background(), c.e.stream, c.durable)
	if err != nil {
		return false
	}
	info, err := ci.Info(context.Background())
	if err != nil {
		return false
	}
	ready, _ := c.e.queueDepth(c.e.queue)
	return info.NumPending == 0 && info.NumAckPending == 0 && ready == 0
}

// stop sends p SIGTERM: it stops receiving, finishes what it received, and
// exits 0 saying "stopped".
func (c *nodeConsumer) stop(p *proc) {
	t := c.e.t
	t.Helper()
	if code := p.stop(30 * time.Second); code != 0 || !strings.Contains(p.out.String(), "stopped") {
		t.Fatalf("%s exited %d after SIGTERM, want 0 and \"stopped\":\n%s", p.name, code, p.out.String())
	}
}

// checkOnce fails unless the handler ran exactly once for each of ids and
// for nothing else.
func (c *nodeConsumer) checkOnce(ids map[string]bool) {
	t := c.e.t
	t.Helper()
	runs := c.e.idCounts(c.table)
	for id := range ids {
		if runs[id] != 1 {
			t.Errorf("message %s handled %d times, want once", id, runs[id])
		}
	}
	if len(runs) != len(ids) {
		t.Errorf("%d ids handled, want %d", len(runs), len(ids))
	}
}

// The Node example consumer (examples/consumers/node) reads the legacy queue
// and a durable JetStream consumer at once, with the Go inbox's table. relayd
// dual-writes 2,000 rows; the consumer is SIGKILLed mid-run and started
// again: each id is handled exactly once, and every delivery of both brokers
// is acked, duplicates included. Then legacy messages without a message-id,
// in the queue and moved into the stream by `relayd backfill` with derived
// ids: each handled once, the queue's copy by the example's derivation. Then
// 200 rows more, and SIGTERM amid them: it exits 0, and once restarted each
// is handled once; stopped again, it leaves nothing unacked.
func TestNodeExampleConsumerDualRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := nodeExample(t)
	ctx := context.Background()
	c := &nodeConsumer{e: e, dir: dir, durable: "node", table: e.table.Schema + ".processed"}
	inboxTable := e.table.Schema + ".inbox"
	db := stdlib.OpenDBFromPool(e.pool)
	defer db.Close()
	if err := inbox.Migrate(ctx, db, inboxTable); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+c.table+` (message_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// AckWait short, so what the killed consumer held comes back soon.
	if _, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
		Durable: c.durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	c.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + e.dbURL, "AMQP_URL=" + e.amqpURL, "QUEUE=" + e.queue,
		"NATS_URL=" + e.natsURL, "STREAM=" + e.stream, "DURABLE=" + c.durable,
		"CONSUMER=node-it", "INBOX_TABLE=" + inboxTable, "HANDLER_TABLE=" + c.table, "PREFETCH=20",
	}

	e.startRelay("relay")
	msgs := make([]outbox.Message, 2000)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "orders.placed", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	ids, err := e.writer.Write(ctx, e.pool, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}

	first := c.start("node consumer")
	testenv.Eventually(t, 60*time.Second, func() bool { return c.handled() >= 300 }, "the consumer handled fewer than 300 messages")
	first.kill()
	t.Logf("SIGKILLed the consumer after %d of %d messages", c.handled(), len(want))
	second := c.start("node consumer, restarted")
	e.waitDelivered(60 * time.Second)
	testenv.Eventually(t, 90*time.Second, func() bool { return c.settled(len(want)) }, "the consumer did not handle and ack every message")
	c.checkOnce(want)

	t.Run("legacy messages without a message-id", func(t *testing.T) {
		c := c.in(t)
		e := c.e
		// Each legacy message reaches the consumer's queue, and a copy of it a
		// queue the backfill moves into the stream (the JetStream copy the
		// inbox dedupes against).
		moved := e.queue + "_legacy"
		ch, err := e.amqpConn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if _, err := ch.QueueDeclare(moved, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if ch, err := e.amqpConn.Channel(); err == nil {
				ch.QueueDelete(moved, false, false, false) //nolint:errcheck // cleanup
				ch.Close()
			}
		})
		if err := ch.QueueBind(moved, "test.legacy", e.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		const n = 200
		legacy := make([]amqp.Publishing, n)
		sent := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
		for i := range legacy {
			legacy[i] = amqp.Publishing{
				Timestamp: sent.Add(time.Duration(i) * time.Second), Type: "order.placed", CorrelationId: fmt.Sprint("c-", i),
				ContentType: "application/json", Body: fmt.Appendf(nil, `{"legacy":%d}`, i),
				Headers: amqp.Table{
					"tenant": "acme <&>", "attempt": int32(i), "big": int64(1)<<40 + 1, "ok": i%2 == 0, "ratio": 0.1,
					"raw": []byte{0xff, 'a' + byte(i%26)}, "at": sent, "trace": amqp.Table{"span": "b7ad", "sampled": true, "tags": []any{"a", int32(2)}},
				},
			}
		}
		e.legacyPublish(legacy, "test.legacy")
		out, err := e.backfillWithin(t, 2*time.Minute, "--queue", moved)
		if err != nil {
			t.Fatalf("backfill: %v\n%s", err, out)
		}
		if sum := decodeSummary(t, out); sum.Moved != n || sum.Derived != n {
			t.Fatalf("backfill summary %+v, want %d moved, each with a derived id", sum, n)
		}
		derived := map[string]bool{}
		for id := range e.streamIDs() {
			if !want[id] {
				derived[id] = true
			}
		}
		if len(derived) != n {
			t.Fatalf("%d derived ids in the stream, want %d", len(derived), n)
		}
		for id := range derived {
			want[id] = true
		}
		testenv.Eventually(t, 60*time.Second, func() bool { return c.settled(len(want)) }, "the consumer did not handle and ack every legacy message")
		c.checkOnce(want)
		var fromQueue int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+inboxTable+` WHERE source = 'amqp' AND message_id = ANY($1)`, keys(derived)).Scan(&fromQueue); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d legacy messages handled once each, %d first from the queue (the example's derived id)", n, fromQueue)
		if fromQueue == 0 {
			t.Error("no legacy message was handled from the queue: the example derived no id for them")
		}
	})

	// SIGTERM amid a batch: it stops receiving, finishes what it received,
	// and exits 0; the restarted consumer gets the rest.
	before := c.handled()
	last := make([]outbox.Message, 200)
	for i := range last {
		last[i] = outbox.Message{Topic: "orders.placed", Payload: fmt.Appendf(nil, `{"last":%d}`, i)}
	}
	if ids, err = e.writer.Write(ctx, e.pool, last...); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		want[id] = true
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return c.handled() >= before+50 }, "the consumer handled fewer than 50 of the last 200 messages")
	c.stop(second)
	t.Logf("SIGTERMed the consumer after %d of the last %d messages", c.handled()-before, len(last))
	third := c.start("node consumer, after SIGTERM")
	e.waitDelivered(60 * time.Second)
	testenv.Eventually(t, 90*time.Second, func() bool { return c.settled(len(want)) }, "the consumer did not handle and ack every message after SIGTERM")
	c.checkOnce(want)

	// Stopped, it holds nothing: what it left unacked would be back in the
	// queue, ready.
	c.stop(third)
	if !c.settled(len(want)) {
		t.Fatal("after SIGTERM the queue or the JetStream consumer holds messages: not every delivery was acked")
	}
	c.checkOnce(want)
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
