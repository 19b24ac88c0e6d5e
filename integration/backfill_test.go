package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/backfill"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// legacyPublish publishes msgs to the test's exchange the way a legacy
// producer does, with confirms.
func (e *env) legacyPublish(msgs []amqp.Publishing, key string) {
	e.t.Helper()
	ch, err := e.amqpConn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	ctx := context.Background()
	var dcs []*amqp.DeferredConfirmation
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, e.exchange, key, true, false, m)
		if err != nil {
			e.t.Fatal(err)
		}
		dcs = append(dcs, dc)
		if len(dcs) >= 2000 {
			for _, dc := range dcs {
				if !dc.Wait() {
					e.t.Fatal("legacy publish nacked")
				}
			}
			dcs = dcs[:0]
		}
	}
	for _, dc := range dcs {
		if !dc.Wait() {
			e.t.Fatal("legacy publish nacked")
		}
	}
}

// queueDepth returns the ready messages and consumers of a queue.
func (e *env) queueDepth(name string) (messages, consumers int) {
	e.t.Helper()
	ch, err := e.amqpConn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Messages, q.Consumers
}

func (e *env) streamCount() uint64 {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

// backfillCmd is `relayd backfill` for this test's queue and stream.
func (e *env) backfillCmd(args ...string) *exec.Cmd {
	if !slices.Contains(args, "--queue") { // the test's own queue, else e.queue
		args = append([]string{"--queue", e.queue}, args...)
	}
	cmd := exec.Command(relaydBin, append([]string{"backfill", "--json"}, args...)...)
	cmd.Env = e.relayEnv("RELAY_METRICS_ADDR=")
	dieWithTest(cmd)
	return cmd
}

// startBackfill starts `relayd backfill` with args (through amqpURL, unless
// ""), its output going to the buffer returned, and its exit to the
// channel; the test's end kills it if it still runs.
func (e *env) startBackfill(t *testing.T, amqpURL string, args ...string) (*exec.Cmd, *testenv.SyncBuffer, <-chan error) {
	t.Helper()
	cmd := e.backfillCmd(args...)
	if amqpURL != "" {
		cmd.Env = append(cmd.Env, "RELAY_AMQP_URL="+amqpURL)
	}
	out, done := startCmd(t, cmd)
	return cmd, out, done
}

// startCmd starts cmd, its output going to the buffer returned and its exit
// to the channel; the test's end kills it if it still runs.
func startCmd(t *testing.T, cmd *exec.Cmd) (*testenv.SyncBuffer, <-chan error) {
	t.Helper()
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return out, done
}

// backfillWithin runs `relayd backfill` with args and returns its output
// and error; a run still going after d (stalled) fails the test.
func (e *env) backfillWithin(t *testing.T, d time.Duration, args ...string) ([]byte, error) {
	t.Helper()
	cmd := e.backfillCmd(args...)
	var out []byte
	var err error
	done := make(chan struct{})
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		cmd.Process.Kill() //nolint:errcheck // the test fails anyway
		<-done
		t.Fatalf("backfill still running after %v (stalled?):\n%s", d, out)
	}
	return out, err
}

// finished waits up to d for a backfill started with startBackfill to exit
// 0, and returns its summary; what names the run in a failure (which the
// test's end then kills).
func finished(t *testing.T, done <-chan error, out *testenv.SyncBuffer, d time.Duration, what string) backfill.Summary {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out.String())
		}
	case <-time.After(d):
		t.Fatalf("%s still running after %v:\n%s", what, d, out.String())
	}
	return decodeSummary(t, []byte(out.String()))
}

func decodeSummary(t *testing.T, out []byte) backfill.Summary {
	t.Helper()
	var s backfill.Summary
	start := strings.Index(string(out), "{")
	if start < 0 {
		t.Fatalf("no JSON summary in output:\n%s", out)
	}
	if err := json.NewDecoder(strings.NewReader(string(out[start:]))).Decode(&s); err != nil {
		t.Fatalf("summary: %v\n%s", err, out)
	}
	return s
}

// 50,000 legacy messages — most with a message-id, 2,500 without, 1,000 the
// relay already delivered to JetStream longer ago than the stream's
// duplicate window — and the backfill SIGKILLed twice mid-way and rerun:
// every legacy message is in the stream exactly once, the queue is empty,
// and the relay's messages were not re-sent.
func TestBackfillExactlyOnceThroughKills(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// A short duplicate window, so only the relay's record can keep the
	// relay's messages from being stored twice.
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	scfg := s.CachedInfo().Config
	scfg.Duplicates = 5 * time.Second
	if _, err := e.js.UpdateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}

	// Dual write put 1,000 rows on both brokers: they sit in the legacy
	// queue and are already in the stream.
	relayed := make([]outbox.Message, 1000)
	for i := range relayed {
		relayed[i] = outbox.Message{Topic: "orders.relayed", Payload: []byte(fmt.Sprintf("relayed %d", i))}
	}
	relayedIDs, err := e.writer.Write(ctx, e.pool, relayed...)
	if err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("relay")
	e.waitDelivered(30 * time.Second)
	r.stop(30 * time.Second)
	deliveredAt := time.Now()

	// 49,000 from legacy producers, 2,500 of them without a message-id.
	var legacy []amqp.Publishing
	withID := map[string]bool{}
	for i := range 49_000 {
		p := amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Timestamp: time.Unix(1700000000+int64(i), 0), Body: []byte(fmt.Sprintf(`{"legacy":%d}`, i)),
			Headers: amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "n": int32(i)}}
		if i%20 != 0 {
			p.MessageId = fmt.Sprintf("legacy-%06d", i)
			withID[p.MessageId] = true
		}
		legacy = append(legacy, p)
	}
	e.legacyPublish(legacy, "orders.legacy")
	if n, _ := e.queueDepth(e.queue); n != 50_000 {
		t.Fatalf("legacy queue holds %d messages, want 50000", n)
	}
	// Past the window: JetStream alone would store the relay's 1,000 again.
	time.Sleep(time.Until(deliveredAt.Add(6 * time.Second))) // let the duplicate window pass; a wait for time itself

	var final backfill.Summary
	for kill := 1; ; kill++ {
		cmd, out, done := e.startBackfill(t, "", "--prefetch", "500")
		if kill <= 2 {
			target := uint64(1000 + kill*15_000)
			testenv.Eventually(t, 2*time.Minute, func() bool { return e.streamCount() >= target }, "backfill run %d made no progress:\n%s", kill, out.String())
			cmd.Process.Kill()
			<-done
			t.Logf("backfill SIGKILLed with %d messages in the stream", e.streamCount())
			continue
		}
		final = finished(t, done, out, 3*time.Minute, "final backfill run")
		break
	}
	t.Logf("final run: %+v", final)

	if n, c := e.queueDepth(e.queue); n != 0 || c != 0 {
		t.Fatalf("legacy queue: %d messages, %d consumers after the backfill; want empty", n, c)
	}
	ids := e.streamIDs()
	if len(ids) != 50_000 {
		t.Errorf("stream has %d distinct ids, want 50000", len(ids))
	}
	dupes, derived := 0, 0
	for id, n := range ids {
		if n > 1 {
			dupes++
		}
		if !withID[id] {
			derived++
		}
	}
	if dupes > 0 {
		t.Errorf("%d ids are in the stream more than once", dupes)
	}
	for id := range withID {
		if ids[id] != 1 {
			t.Fatalf("legacy message %s is in the stream %d times, want 1", id, ids[id])
		}
	}
	for _, id := range relayedIDs {
		if ids[id] != 1 {
			t.Fatalf("relayed message %s is in the stream %d times, want 1 (re-sent by the backfill?)", id, ids[id])
		}
	}
	if derived != 2450+1000 { // 2,450 without an id (49,000/20) plus the relay's 1,000
		t.Errorf("%d stream ids are not legacy message-ids, want 3450", derived)
	}
	if final.AlreadyDelivered == 0 && final.Moved == 0 {
		t.Errorf("final run did nothing: %+v", final)
	}
}

// deadLetterQueue declares a dead-letter queue of the test's own, deleted
// when it ends, and returns it with a channel to look at it.
func (e *env) deadLetterQueue() (string, *amqp.Channel) {
	e.t.Helper()
	dlq := e.queue + "_dlq"
	ch, err := e.amqpConn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { ch.Close() })
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if c, err := amqp.Dial(e.amqpURL); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(dlq, false, false, false)
			}
			c.Close()
		}
	})
	return dlq, ch
}

// A message JetStream will never take (over max_payload) goes to the
// dead-letter queue with its reason; everything else moves.
func TestBackfillDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dlq, ch := e.deadLetterQueue()
	var msgs []amqp.Publishing
	for i := range 100 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("ok-%d", i), Body: []byte("small"), DeliveryMode: amqp.Persistent})
	}
	big := amqp.Publishing{MessageId: "too-big", Body: make([]byte, int(e.nc.MaxPayload())+1), DeliveryMode: amqp.Persistent, Priority: 3, ReplyTo: "replies"}
	msgs = append(msgs[:50], append([]amqp.Publishing{big}, msgs[50:]...)...)
	e.legacyPublish(msgs, "orders.dlq")

	out, err := e.backfillCmd("--dead-letter-queue", dlq).CombinedOutput()
	if err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	sum := decodeSummary(t, out)
	if sum.Moved != 100 || sum.DeadLettered != 1 {
		t.Fatalf("summary %+v: want 100 moved, 1 dead-lettered", sum)
	}
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Fatalf("queue holds %d messages after the run", n)
	}
	d, ok, err := ch.Get(dlq, true)
	if err != nil || !ok {
		t.Fatalf("dead-letter queue empty: %v", err)
	}
	reason, _ := d.Headers[backfill.ReasonHeader].(string)
	if d.MessageId != "too-big" || len(d.Body) != len(big.Body) || !strings.Contains(reason, "max_payload") {
		t.Fatalf("dead-lettered %q (%d bytes) reason %q; want too-big, whole, with the max_payload reason", d.MessageId, len(d.Body), reason)
	}
	// Where it was published to, for a re-drive: its routing key is its
	// subject.
	if rk, ex := d.Headers[backfill.RoutingKeyHeader], d.Headers[backfill.ExchangeHeader]; rk != "orders.dlq" || ex != e.exchange || d.Priority != 3 || d.ReplyTo != "replies" {
		t.Fatalf("dead-lettered with routing key %v, exchange %v, priority %d, reply-to %q; want orders.dlq, %s, 3, replies",
			rk, ex, d.Priority, d.ReplyTo, e.exchange)
	}
	ids := e.streamIDs()
	for i := range 100 {
		if ids[fmt.Sprintf("ok-%d", i)] != 1 {
			t.Fatalf("ok-%d in the stream %d times", i, ids[fmt.Sprintf("ok-%d", i)])
		}
	}
	if ids["too-big"] != 0 {
		t.Fatal("the oversize message is in the stream")
	}
}

// The dead-letter queue deleted mid-run: a message refused for good stays
// ours, tried again every few seconds, and is dead-lettered once the queue
// is back — saying that it is refused once, and that it cannot move once,
// not on every try.
func TestBackfillWaitsForAMissingDeadLetterQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dlq, ch := e.deadLetterQueue()
	started := time.Now()
	cmd, out, done := e.startBackfill(t, "", "--dead-letter-queue", dlq, "--follow")
	testenv.Eventually(t, 30*time.Second, func() bool { _, c := e.queueDepth(e.queue); return c == 1 }, "the backfill never consumed")
	if _, err := ch.QueueDelete(dlq, false, false, false); err != nil {
		t.Fatal(err)
	}
	big := amqp.Publishing{MessageId: "too-big", Body: make([]byte, int(e.nc.MaxPayload())+1), DeliveryMode: amqp.Persistent}
	msgs := []amqp.Publishing{big}
	// More than the prefetch (4,096) after it: the message kept unacked
	// does not hold up their acks, or RabbitMQ would stop delivering.
	for i := range 6000 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("after-%d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(msgs, "orders.dlq")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.streamCount() == 6000 }, "the messages after the one that cannot move did not all move")
	time.Sleep(8 * time.Second) // tried again 5 to 6 times meanwhile
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { n, _ := e.queueDepth(dlq); return n == 1 }, "not dead-lettered once the queue was back:\n%s", out.String())
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Fatalf("%d messages left in the legacy queue", n)
	}
	cmd.Process.Signal(syscall.SIGINT) //nolint:errcheck // the wait below fails if it did not stop
	sum := finished(t, done, out, 30*time.Second, "backfill after SIGINT")
	if sum.DeadLettered != 1 || sum.Moved != 6000 || sum.Requeued != 0 {
		t.Fatalf("summary %+v: want 1 dead-lettered, 6,000 moved, none requeued", sum)
	}
	// Once for the message; the wait's warning once every 30 s at most.
	if line := `level=WARN msg="backfill: JetStream refuses message for good"`; strings.Count(out.String(), line) != 1 {
		t.Errorf("said %q %d times, want once:\n%s", line, strings.Count(out.String(), line), out.String())
	}
	most := 1 + int(time.Since(started)/(30*time.Second))
	if line := `level=WARN msg="backfill: messages cannot move for now`; strings.Count(out.String(), line) < 1 || strings.Count(out.String(), line) > most {
		t.Errorf("said %q %d times, want 1 to %d:\n%s", line, strings.Count(out.String(), line), most, out.String())
	}
	if strings.Contains(out.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", out.String())
	}
}

// Without a dead-letter queue, a message JetStream will never take is held
// unacked until the run ends, and the messages after it still move and are
// acked: more of them than the prefetch, so a held delivery that held up
// the acks behind it would stall the run.
func TestBackfillHoldsARefusedMessageAndMovesTheRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var msgs []amqp.Publishing
	for i := range 200 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("ok-%d", i), Body: []byte("small"), DeliveryMode: amqp.Persistent})
	}
	big := amqp.Publishing{MessageId: "too-big", Body: make([]byte, int(e.nc.MaxPayload())+1), DeliveryMode: amqp.Persistent, Priority: 3, ReplyTo: "replies"}
	msgs = append(msgs[:10], append([]amqp.Publishing{big}, msgs[10:]...)...)
	e.legacyPublish(msgs, "orders.held")

	out, err := e.backfillWithin(t, 90*time.Second, "--prefetch", "16")
	if err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	sum := decodeSummary(t, out)
	if sum.Moved != 200 || sum.Failed != 1 {
		t.Fatalf("summary %+v: want 200 moved, 1 failed", sum)
	}
	ids := e.streamIDs()
	for i := range 200 {
		if ids[fmt.Sprintf("ok-%d", i)] != 1 {
			t.Fatalf("ok-%d in the stream %d times", i, ids[fmt.Sprintf("ok-%d", i)])
		}
	}
	if ids["too-big"] != 0 {
		t.Fatal("the oversize message is in the stream")
	}
	// Only the held message went back to the queue.
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var back []string
	for {
		d, ok, err := ch.Get(e.queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		back = append(back, d.MessageId)
	}
	if len(back) != 1 || back[0] != "too-big" {
		t.Fatalf("back in the queue: %v, want just too-big", back)
	}
}

// --dry-run reports and changes nothing: same queue, same stream.
func TestBackfillDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var msgs []amqp.Publishing
	for i := range 300 {
		p := amqp.Publishing{Body: []byte(fmt.Sprintf("m%d", i)), DeliveryMode: amqp.Persistent}
		if i%3 != 0 {
			p.MessageId = fmt.Sprintf("dry-%d", i)
		}
		msgs = append(msgs, p)
	}
	e.legacyPublish(msgs, "orders.dry")
	before := e.streamCount()

	out, err := e.backfillCmd("--dry-run").CombinedOutput()
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	sum := decodeSummary(t, out)
	if !sum.DryRun || sum.Moved != 300 || sum.Derived != 100 {
		t.Fatalf("dry-run summary %+v: want 300 would-move, 100 derived ids", sum)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { n, _ := e.queueDepth(e.queue); return n == 300 }, "queue not back to 300 after the dry run")
	if after := e.streamCount(); after != before {
		t.Fatalf("stream went from %d to %d messages in a dry run", before, after)
	}
	var recorded int
	e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table.Backfilled()).Scan(&recorded)
	if recorded != 0 {
		t.Fatalf("dry run recorded %d moved ids", recorded)
	}
}

// Another consumer on the queue would take some of its messages: the
// backfill refuses to start (exit 2) unless told to allow it.
func TestBackfillRefusesOtherConsumers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.legacyPublish([]amqp.Publishing{{MessageId: "one", Body: []byte("x")}}, "orders.other")
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume(e.queue, "legacy-consumer", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cmd := e.backfillCmd()
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "allow-other-consumers") {
		t.Fatalf("exit %d, output %q; want exit 2 mentioning --allow-other-consumers", cmd.ProcessState.ExitCode(), out)
	}
	ch.Close() // the other consumer goes; its unacked message returns to the queue
	out, err = e.backfillCmd().CombinedOutput()
	if err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	if sum := decodeSummary(t, out); sum.Moved != 1 {
		t.Fatalf("summary %+v, want 1 moved", sum)
	}
}

// Without a dead-letter queue, refused messages that fill the whole
// prefetch would stall the run (RabbitMQ delivers nothing more, the queue
// never drains): it stops, saying to use --dead-letter-queue, with every
// message in the stream or back in the queue.
func TestBackfillStopsWhenHeldMessagesFillThePrefetch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	big := make([]byte, int(e.nc.MaxPayload())+1)
	var msgs []amqp.Publishing
	for i := range 30 {
		m := amqp.Publishing{MessageId: fmt.Sprintf("m-%02d", i), Body: []byte("small"), DeliveryMode: amqp.Persistent}
		if i%3 == 0 {
			m.MessageId, m.Body = fmt.Sprintf("big-%02d", i), big
		}
		msgs = append(msgs, m)
	}
	e.legacyPublish(msgs, "orders.heldfull")

	out, err := e.backfillWithin(t, 90*time.Second, "--prefetch", "4")
	if err == nil || !strings.Contains(string(out), "--dead-letter-queue") {
		t.Fatalf("backfill: %v; want a failure naming --dead-letter-queue:\n%s", err, out)
	}
	// Every message once: in the stream (the small ones moved) or back in
	// the queue; no oversize one in the stream.
	seen := map[string]int{}
	for id, n := range e.streamIDs() {
		seen[id] += n
		if strings.HasPrefix(id, "big-") {
			t.Errorf("%s in the stream", id)
		}
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	testenv.Eventually(t, 10*time.Second, func() bool { n, _ := e.queueDepth(e.queue); return n+len(seen) >= len(msgs) }, "messages missing after the run")
	for {
		d, ok, err := ch.Get(e.queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		seen[d.MessageId]++
	}
	for _, m := range msgs {
		if seen[m.MessageId] != 1 {
			t.Errorf("%s: %d times in the stream and the queue, want 1", m.MessageId, seen[m.MessageId])
		}
	}
}

// --limit counts the whole run, not each RabbitMQ connection: a cut
// mid-run, and the run still stops at the limit.
func TestBackfillLimitHoldsAcrossAConnectionCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	px := newFaultProxy(t, "amqp", hostOf(t, e.amqpURL))
	proxy, amqpURL := px.proxy, px.url(e.amqpURL)

	const total, limit = 3000, 1000
	var msgs []amqp.Publishing
	for i := range total {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("l-%05d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(msgs, "orders.limit")

	_, out, done := e.startBackfill(t, amqpURL, "--limit", fmt.Sprint(limit), "--rate", "1000", "--prefetch", "50")

	testenv.Eventually(t, 30*time.Second, func() bool { return e.streamCount() >= 300 }, "stuck before the cut:\n%s", out.String())
	proxy.Stop() // the connection drops; unacked deliveries return to the queue
	time.Sleep(500 * time.Millisecond)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	sum := finished(t, done, out, 60*time.Second, "backfill")
	// Moved before the cut and not acked, skipped after it: already. (An
	// ack written but lost in the cut counts its message twice, once moved
	// and once already: the stream may hold a few fewer than the limit.)
	if sum.Moved+sum.AlreadyDelivered != limit {
		t.Fatalf("handled %d across the cut, want the limit, %d (summary %+v)", sum.Moved+sum.AlreadyDelivered, limit, sum)
	}
	n := int(e.streamCount())
	if n > limit || n < limit-100 {
		t.Fatalf("stream holds %d, want the limit, %d, or a few fewer", n, limit)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { q, _ := e.queueDepth(e.queue); return q == total-n },
		"queue does not hold the %d not moved", total-n)
}

// The backfill rides out a RabbitMQ connection cut (through a proxy), a
// NATS restart and a SIGINT mid-run; the rerun finishes: every message in
// the stream once, the queue empty.
func TestBackfillSurvivesRestartsAndSIGINT(t *testing.T) {
	t.Parallel()
	port, dir := freePort(t), t.TempDir()
	ns := startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	e := newEnv(t, fmt.Sprintf("nats://127.0.0.1:%d", port))

	px := newFaultProxy(t, "amqp", hostOf(t, e.amqpURL))
	proxy, amqpURL := px.proxy, px.url(e.amqpURL)

	const total = 30_000
	var msgs []amqp.Publishing
	for i := range total {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("r-%05d", i), Body: []byte(fmt.Sprintf("%d", i)), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(msgs, "orders.restart")

	cmd, out, done := e.startBackfill(t, amqpURL, "--rate", "4000", "--prefetch", "200")
	atLeast := func(n uint64, what string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, func() bool { return e.streamCount() >= n }, "%s: stuck below %d:\n%s", what, n, out.String())
	}

	atLeast(4000, "before the RabbitMQ cut")
	proxy.Stop()            // every RabbitMQ connection drops; unacked deliveries return to the queue
	time.Sleep(time.Second) // outage length
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	atLeast(10_000, "after the RabbitMQ cut")

	ns.Shutdown()
	ns.WaitForShutdown()
	time.Sleep(2 * time.Second) // outage length
	ns = startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	atLeast(16_000, "after the NATS restart")

	cmd.Process.Signal(syscall.SIGINT)
	first := finished(t, done, out, 30*time.Second, "backfill after SIGINT")
	if n, _ := e.queueDepth(e.queue); n == 0 || first.Moved == 0 {
		t.Fatalf("SIGINT came too late to test a rerun: queue %d, summary %+v", n, first)
	}

	_, out2, done2 := e.startBackfill(t, amqpURL)
	if err := <-done2; err != nil {
		t.Fatalf("rerun: %v\n%s", err, out2.String())
	}
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Fatalf("queue holds %d after the rerun", n)
	}
	ids := e.streamIDs()
	for i := range total {
		if n := ids[fmt.Sprintf("r-%05d", i)]; n != 1 {
			t.Fatalf("r-%05d in the stream %d times, want 1", i, n)
		}
	}
	if len(ids) != total {
		t.Fatalf("stream has %d ids, want %d", len(ids), total)
	}
}

// A stream that is full (DiscardNew at MaxMsgs) refuses the backfill's
// messages for now: the backfill keeps them and tries again after a wait
// that grows with each refusal — not at once, when the run spun through
// them as fast as the three services could go, and not by requeueing them,
// which a quorum queue counts against its delivery limit — says so once,
// and moves them when the stream has room: every message once. A message larger than the stream's whole MaxBytes, which no room
// will fit, is refused for good (held, back in the queue at the end). With
// --limit, a requeued message counts once, and the run goes on until the
// limit is reached by messages that settled.
func TestBackfillWaitsForAFullStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.limitStream(10, 64<<10)
	msgs := []amqp.Publishing{{MessageId: "too-big", Body: make([]byte, 100<<10), DeliveryMode: amqp.Persistent}}
	for i := range 30 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("full-%d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	// And 20 past the limit below, which stay in the queue.
	for i := range 20 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("past-%d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(msgs, "orders.full")

	// --limit 31: the messages refused meanwhile count once; the run goes
	// on until 31 settled.
	_, out, done := e.startBackfill(t, "", "--limit", "31")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.streamCount() == 10 }, "the stream never took its 10")
	time.Sleep(3 * time.Second) // refused meanwhile
	e.limitStream(-1, 64<<10)
	sum := finished(t, done, out, 60*time.Second, "backfill after the stream had room")
	// 20 refused for 3 s, tried again in place: none requeued.
	if sum.Moved != 30 || sum.Failed != 1 || sum.Requeued != 0 {
		t.Fatalf("summary %+v: want 30 moved, 1 failed (too big), none requeued", sum)
	}
	if n, _ := e.queueDepth(e.queue); n != 21 {
		t.Errorf("%d messages back in the queue, want the one too big and the 20 past the limit", n)
	}
	if n := strings.Count(out.String(), "messages cannot move for now"); n != 1 {
		t.Errorf("said %d times that messages cannot move, want once:\n%s", n, out.String())
	}
	ids := e.streamIDs()
	for i := range 30 {
		if id := fmt.Sprintf("full-%d", i); ids[id] != 1 {
			t.Errorf("%s in the stream %d times, want once", id, ids[id])
		}
	}
	if len(ids) != 30 {
		t.Errorf("%d distinct ids in the stream, want the 30 before the limit", len(ids))
	}
}

// The legacy queue is a quorum queue with a delivery limit (RabbitMQ 4.0
// sets 20 on every quorum queue): RabbitMQ drops a message returned to it
// more often than that. While the stream is full for a few seconds, the
// backfill keeps the messages it cannot move and tries them again; when it
// requeued them after each wait, most of them went past the limit and were
// lost.
func TestBackfillLosesNothingFromAQuorumQueueWithADeliveryLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(e.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(2)}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(e.queue, "orders.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	e.limitStream(10, 64<<10)
	var msgs []amqp.Publishing
	for i := range 40 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("quorum-%d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(msgs, "orders.quorum")

	_, out, done := e.startBackfill(t, "")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.streamCount() == 10 }, "the stream never took its 10")
	time.Sleep(3 * time.Second) // 30 refused meanwhile, 5 to 6 times each
	e.limitStream(-1, 64<<10)
	sum := finished(t, done, out, 60*time.Second, "backfill after the stream had room")
	ids := e.streamIDs()
	for i := range 40 {
		if id := fmt.Sprintf("quorum-%d", i); ids[id] != 1 {
			t.Errorf("%s in the stream %d times, want once", id, ids[id])
		}
	}
	if sum.Moved != 40 || sum.Requeued != 0 {
		t.Fatalf("summary %+v: want 40 moved, none requeued", sum)
	}
}

// A relayd instance still on RELAY_TARGETS=amqp (missed in the dual-write
// rollout) finished a row without JetStream lately: the backfill refuses to
// start (exit 1, saying why) — it would skip the queue's copies of the rows
// such an instance has in flight, still owed to JetStream in the outbox,
// and JetStream would get them from neither. A dry run says so and goes on.
func TestBackfillRefusesWhileAnInstanceIsNotInDualWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.legacyPublish([]amqp.Publishing{{MessageId: "dw-1", Body: []byte("x"), DeliveryMode: amqp.Persistent}}, "orders.dw")
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.table.Delivered()+`
		(done_at, id, message_id, amqp_delivered_at, nats_delivered_at) VALUES (now(), 1, gen_random_uuid(), now(), NULL)`); err != nil {
		t.Fatal(err)
	}
	out, err := e.backfillWithin(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "RELAY_TARGETS=amqp,nats") {
		t.Fatalf("backfill: %v, want exit 1 naming RELAY_TARGETS:\n%s", err, out)
	}
	if n := e.streamCount(); n != 0 {
		t.Fatalf("%d messages moved by a run that refused to start", n)
	}
	out, err = e.backfillWithin(t, 30*time.Second, "--dry-run")
	if err != nil || !strings.Contains(string(out), "would refuse to start") {
		t.Fatalf("dry run: %v, want it to go on with a warning:\n%s", err, out)
	}
}

// A running relay that reports phase amqp (here its report alone, before
// it finished anything) stops the backfill at start, named.
func TestBackfillRefusesWhileARelayReportsPhaseAMQP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.legacyPublish([]amqp.Publishing{{MessageId: "dw-2", Body: []byte("x"), DeliveryMode: amqp.Persistent}}, "orders.dw")
	if err := phase.Beat(context.Background(), e.pool, e.table, phase.Instance{
		Instance: "old-pod:1", Phase: phase.AMQP, Pinned: true, Version: "test", StartedAt: time.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	out, err := e.backfillWithin(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "old-pod:1 runs phase amqp") {
		t.Fatalf("backfill: %v, want exit 1 naming the relay in phase amqp:\n%s", err, out)
	}
	if n := e.streamCount(); n != 0 {
		t.Fatalf("%d messages moved by a run that refused to start", n)
	}
}

// The outbox's phase set to amqp stops the backfill at start, even with no
// relay running: a relay that starts follows the table into amqp, and the
// in-flight rows the run would skip as owed to JetStream never reach it.
func TestBackfillRefusesWhileTheTablesPhaseIsAMQP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.legacyPublish([]amqp.Publishing{{MessageId: "dw-3", Body: []byte("x"), DeliveryMode: amqp.Persistent}}, "orders.dw")
	e.setTablePhase(phase.AMQP)
	out, err := e.backfillWithin(t, 30*time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "relayd phase set dual") {
		t.Fatalf("backfill with the table in amqp: %v, want exit 1 saying to set the phase to dual:\n%s", err, out)
	}
	if n := e.streamCount(); n != 0 {
		t.Fatalf("%d messages moved by a run that refused to start", n)
	}
	e.setTablePhase(phase.Dual)
	if out, err := e.backfillWithin(t, 30*time.Second); err != nil {
		t.Fatalf("backfill with the table in dual: %v\n%s", err, out)
	}
}

// An instance on RELAY_TARGETS=amqp that had finished nothing lately passes
// the check at start; once it finishes a row, the run stops (exit 1),
// within the 30 s between checks.
func TestBackfillStopsWhenAnInstanceLeavesDualWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, out, done := e.startBackfill(t, "", "--follow")
	testenv.Eventually(t, 30*time.Second, func() bool { _, c := e.queueDepth(e.queue); return c == 1 }, "the backfill never consumed")
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.table.Delivered()+`
		(done_at, id, message_id, amqp_delivered_at, nats_delivered_at) VALUES (now(), 1, gen_random_uuid(), now(), NULL)`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out.String(), "not in dual write") {
			t.Fatalf("backfill ended with %v, want exit 1 saying an instance is not in dual write:\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("backfill still running 60 s after an instance finished a row without JetStream:\n%s", out.String())
	}
}

// The legacy queue deleted under a run (--follow: it would go on for
// ever): the run ends, exit 1, naming RabbitMQ's answer, once RabbitMQ has
// given it for 30 s, instead of reconnecting every 10 s to meet the same
// NOT_FOUND for ever.
func TestBackfillEndsWhenTheQueueIsGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.legacyPublish([]amqp.Publishing{{MessageId: "gone-1", Body: []byte("x"), DeliveryMode: amqp.Persistent}}, "orders.gone")
	_, out, done := e.startBackfill(t, "", "--follow")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.streamCount() == 1 }, "the message never moved")
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(e.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("backfill ended with %v, want exit status 1:\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "NOT_FOUND") {
			t.Fatalf("output does not name RabbitMQ's answer (NOT_FOUND):\n%s", out.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("backfill still running 90 s after its queue was deleted:\n%s", out.String())
	}
}

// A consumer left on the queue by a connection that died without a close
// holds its unacked deliveries until RabbitMQ notices: the run is not
// drained while it is there, though nothing is ready, and moves its
// messages once they are back.
func TestBackfillWaitsForAGhostConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var msgs []amqp.Publishing
	for i := range 400 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("ghost-%d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(msgs, "orders.ghost")
	_, out, done := e.startBackfill(t, "", "--prefetch", "50", "--rate", "200")
	testenv.Eventually(t, 30*time.Second, func() bool { _, c := e.queueDepth(e.queue); return c == 1 }, "the backfill never consumed")

	// The ghost: another connection's consumer (as the run's own before a
	// reset), holding 50 deliveries unacked.
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	held, err := ch.Consume(e.queue, "ghost", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		select {
		case <-held:
		case <-time.After(30 * time.Second):
			t.Fatal("the ghost got fewer than 50 deliveries")
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool { n, _ := e.queueDepth(e.queue); return n == 0 }, "the queue never emptied")
	select {
	case err := <-done:
		t.Fatalf("the backfill ended (%v) while the ghost held 50 messages:\n%s", err, out.String())
	case <-time.After(3 * time.Second):
	}
	conn.Close() // the broker notices: the 50 go back to the queue
	sum := finished(t, done, out, 30*time.Second, "backfill after the ghost went")
	if sum.Moved != 400 {
		t.Fatalf("summary %+v: want 400 moved", sum)
	}
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
	ids := e.streamIDs()
	for i := range 400 {
		if id := fmt.Sprintf("ghost-%d", i); ids[id] != 1 {
			t.Errorf("%s in the stream %d times, want once", id, ids[id])
		}
	}
}

// The stream deleted mid-run is the operator's to put back: the backfill
// says at once which stream is missing, keeps the messages unacked (none
// dead-lettered, none lost), and moves them once the stream is created
// again, each once.
func TestBackfillWaitsForADeletedStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var first, later []amqp.Publishing
	for i := range 20 {
		first = append(first, amqp.Publishing{MessageId: fmt.Sprintf("first-%d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	for i := range 40 {
		later = append(later, amqp.Publishing{MessageId: fmt.Sprintf("later-%d", i), Body: []byte("x"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(first, "orders.moved")
	_, out, done := e.startBackfill(t, "", "--limit", "60")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.streamCount() == 20 }, "the first 20 never reached the stream")

	ctx := context.Background()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if err := e.js.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	e.legacyPublish(later, "orders.moved")
	want := "JetStream has no stream " + e.stream
	testenv.Eventually(t, 5*time.Second, func() bool { return strings.Contains(out.String(), want) }, "no line saying %q:\n%s", want, out)
	testenv.CreateStream(t, ctx, e.js, cfg)
	sum := finished(t, done, out, 60*time.Second, "backfill after the stream was created again")
	if sum.Moved != 60 || sum.Failed != 0 || sum.DeadLettered != 0 {
		t.Fatalf("summary %+v: want 60 moved, none failed or dead-lettered", sum)
	}
	ids := e.streamIDs()
	for i := range 40 {
		if id := fmt.Sprintf("later-%d", i); ids[id] != 1 {
			t.Errorf("%s in the stream %d times, want once", id, ids[id])
		}
	}
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Errorf("%d messages left in the legacy queue, want none", n)
	}
}
