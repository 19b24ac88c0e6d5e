package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/replay"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// replayCmd is `relayd replay --json` for this test's outbox, stream and
// exchange.
func (e *env) replayCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(relaydBin, append([]string{"replay", "--json"}, args...)...)
	cmd.Env = e.relayEnv("RELAY_METRICS_ADDR=")
	dieWithTest(cmd)
	return cmd
}

func decodeReplay(t *testing.T, out []byte) replay.Summary {
	t.Helper()
	var s replay.Summary
	start := strings.Index(string(out), "{\n")
	if start < 0 {
		t.Fatalf("no JSON summary in output:\n%s", out)
	}
	if err := json.NewDecoder(strings.NewReader(string(out[start:]))).Decode(&s); err != nil {
		t.Fatalf("summary: %v\n%s", err, out)
	}
	return s
}

// replayRecord reads the test's unfinished replay run: its position and
// sent count; ok false when none is unfinished.
func (e *env) replayRecord() (fromSeq, position, sent int64, ok bool) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT from_seq, position, sent FROM `+e.table.Side("replay")+
		` WHERE finished_at IS NULL`).Scan(&fromSeq, &position, &sent)
	if err != nil {
		return 0, 0, 0, false
	}
	return fromSeq, position, sent, true
}

// streamOrders publishes n messages m-0000… on orders.a to the stream alone,
// as the nats-only phase leaves them, and returns their ids.
func (e *env) streamOrders(n int) map[string]bool {
	e.t.Helper()
	want := map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("m-%04d", i)
		want[id] = true
		m := &nats.Msg{Subject: e.prefix + "orders.a", Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			e.t.Fatal(err)
		}
	}
	return want
}

// awaitReplay fails the test unless the replay started as cmd (done, out:
// startCmd's) exits 0 within 90 s of after; else its goroutines, which Go
// prints on SIGQUIT, are in the failure.
func awaitReplay(t *testing.T, cmd *exec.Cmd, done <-chan error, out fmt.Stringer, after string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("replay after %s: %v\n%s", after, err, out)
		}
	case <-time.After(90 * time.Second):
		cmd.Process.Signal(syscall.SIGQUIT) //nolint:errcheck // its exit is read below
		<-done
		t.Fatalf("the replay did not finish within 90 s of %s:\n%s", after, out)
	}
}

// amqpMsg is what the drill checks of each message the legacy queue got.
type amqpMsg struct {
	routingKey, tenant string
}

// drainQueue reads the test's queue until it has been empty for quiet: each
// message id with what it came with, and how many times.
func (e *env) drainQueue(quiet time.Duration) (map[string]int, map[string]amqpMsg) {
	e.t.Helper()
	ch, err := e.amqpConn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	deliveries, err := ch.Consume(e.queue, "", true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, props := map[string]int{}, map[string]amqpMsg{}
	for {
		select {
		case d := <-deliveries:
			ids[d.MessageId]++
			tenant, _ := d.Headers["tenant"].(string)
			props[d.MessageId] = amqpMsg{routingKey: d.RoutingKey, tenant: tenant}
		case <-time.After(quiet):
			if n, _ := e.queueDepth(e.queue); n == 0 {
				return ids, props
			}
		}
	}
}

// The rollback drill: dual write delivers 500 rows to both brokers; the
// phase goes to nats and 5,000 rows reach JetStream only (with, beside them,
// 10 messages the backfill moved from the legacy queue and one without a
// Nats-Msg-Id); the phase goes back to dual. A dry run publishes nothing;
// `relayd replay` is SIGKILLed mid-run and rerun: the legacy queue gets each
// of the 5,000 once (a copy more only within the documented bound: the
// batches in flight), with its routing key and headers, and nothing else.
func TestReplayRollbackDrill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	write := func(n int, topic string) []string {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: topic, Headers: map[string]string{"tenant": "acme"}, Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		}
		ids, err := e.writer.Write(ctx, e.pool, msgs...)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}

	// Dual write: these reach RabbitMQ and must not be replayed.
	// One relay follows `relayd phase set` through the drill, never
	// restarted.
	e.setTablePhase(phase.Dual)
	e.startRelay("relay")
	e.waitInstances(1, phase.Dual)
	dualIDs := write(500, "orders.dual")
	e.waitDelivered(30 * time.Second)
	before, _ := e.drainQueue(time.Second)
	if len(before) != 500 {
		t.Fatalf("dual write put %d ids in the legacy queue, want 500", len(before))
	}

	// Nats only.
	e.setTablePhase(phase.NATS)
	e.waitInstances(1, phase.NATS)
	natsIDs := write(5000, "orders.nats")
	testenv.Eventually(t, 60*time.Second, func() bool { total, _, n := e.counts(); return n == total }, "nats-only rows not delivered")
	// What the backfill moved from the legacy queue, and a message without
	// an id, in the stream meanwhile.
	b := &nats.Msg{Header: nats.Header{}}
	for i := range 10 {
		id := fmt.Sprintf("legacy-%02d", i)
		b = &nats.Msg{Subject: e.prefix + "orders.legacy", Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if _, err := e.js.PublishMsg(ctx, b); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.table.Backfilled()+` (message_id, queue) VALUES ($1, 'legacy')`, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.js.Publish(ctx, e.prefix+"orders.anonymous", []byte("no id")); err != nil {
		t.Fatal(err)
	}

	// A replay while the phase is still nats is refused.
	if out, err := e.replayCmd().CombinedOutput(); err == nil || !strings.Contains(string(out), "phase is nats") {
		t.Fatalf("replay in the nats phase: %v, want exit 1 saying so:\n%s", err, out)
	}
	e.setTablePhase(phase.Dual)
	e.waitInstances(1, phase.Dual)

	// The dry run counts and changes nothing.
	out, err := e.replayCmd("--dry-run").CombinedOutput()
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	dry := decodeReplay(t, out)
	if !dry.DryRun || dry.Sent != 5000 || dry.SkippedDelivered != 500 || dry.SkippedBackfilled != 10 || dry.WithoutID != 1 || !dry.Finished {
		t.Errorf("dry run counted %+v: want 5000 to send, 500 delivered, 10 backfilled and 1 without id skipped", dry.Counts)
	}
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Fatalf("the dry run published %d messages", n)
	}
	var runs int
	e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Side("replay")).Scan(&runs)
	if runs != 0 {
		t.Fatalf("the dry run recorded %d runs", runs)
	}

	// The run, SIGKILLed once it recorded progress, and the rerun.
	first := e.replayCmd("--rate", "2000")
	firstOut, done := startCmd(t, first)
	var killedAt, killedSent int64
	testenv.Eventually(t, 30*time.Second, func() bool {
		from, pos, sent, ok := e.replayRecord()
		killedAt, killedSent = pos, sent
		return ok && pos > from && sent >= 1000
	}, "the replay recorded no progress:\n%s", firstOut)
	first.Process.Kill()
	<-done
	t.Logf("replay SIGKILLed with its record at sequence %d, %d sent", killedAt, killedSent)
	if _, _, _, ok := e.replayRecord(); !ok {
		t.Fatalf("the killed run is not unfinished:\n%s", firstOut)
	}
	// Another window while it is unfinished is refused.
	if out, err := e.replayCmd("--from-seq", "1").CombinedOutput(); err == nil || !strings.Contains(string(out), "--restart") {
		t.Fatalf("a new window over an unfinished run: %v, want exit 1 naming --restart:\n%s", err, out)
	}
	out, err = e.replayCmd("--rate", "20000").CombinedOutput()
	if err != nil {
		t.Fatalf("rerun: %v\n%s", err, out)
	}
	sum := decodeReplay(t, out)
	t.Logf("rerun: %+v", sum)
	if !sum.Resumed || !sum.Finished || sum.Failed != 0 {
		t.Errorf("rerun: resumed %v, finished %v, failed %d; want a finished resumption", sum.Resumed, sum.Finished, sum.Failed)
	}
	if got := sum.Record.Sent; got < 5000 {
		t.Errorf("the record says %d sent, want at least 5000", got)
	}

	ids, props := e.drainQueue(time.Second)
	want := map[string]bool{}
	for _, id := range natsIDs {
		want[id] = true
	}
	missing, extra, dupes := tally(want, ids)
	// A SIGKILL re-sends at most what was confirmed and not yet recorded:
	// the batches in flight (docs/migration.md).
	bound := replay.DefaultInFlight * min(replay.DefaultBatchSize, 2000/10)
	t.Logf("legacy queue: %d ids, %d missing, %d extra, %d duplicates (bound %d)", len(ids), missing, extra, dupes, bound)
	if missing > 0 || extra > 0 || dupes > bound {
		t.Errorf("legacy queue after the replay: %d missing, %d not nats-only rows, %d duplicates (bound %d)", missing, extra, dupes, bound)
	}
	for _, id := range natsIDs {
		if p := props[id]; p.routingKey != "orders.nats" || p.tenant != "acme" {
			t.Fatalf("replayed %s came with routing key %q, tenant header %q; want orders.nats, acme", id, p.routingKey, p.tenant)
		}
	}
	for _, id := range dualIDs {
		if ids[id] > 0 {
			t.Fatalf("dual-written row %s was replayed", id)
		}
	}

	// Once finished, the same window again is nothing to do.
	out, err = e.replayCmd().CombinedOutput()
	if err != nil {
		t.Fatalf("replay after the finished run: %v\n%s", err, out)
	}
	if again := decodeReplay(t, out); !again.AlreadyDone || again.Sent != 0 {
		t.Errorf("replay after the finished run: %+v, want already done, nothing sent", again)
	}
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Errorf("replay after the finished run published %d messages", n)
	}
}

// With no nats-only period in the history and no window flags, replay exits
// 1 saying so.
func TestReplayWithoutANATSPeriod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setTablePhase(phase.Dual)
	out, err := e.replayCmd().CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "no nats-only period") {
		t.Fatalf("replay without a nats period: %v, want exit 1 saying so:\n%s", err, out)
	}
}

// A message RabbitMQ returns unroutable fails the run (exit 1) with the
// position recorded before it; once a queue is bound for it, the rerun
// resumes there and everything arrives.
func TestReplayStopsAtAnUnroutableMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var ids []string
	for i := range 20 {
		topic := "orders.a"
		if i == 10 {
			topic = "unbound.x"
		}
		id := fmt.Sprintf("m-%02d", i)
		ids = append(ids, id)
		m := &nats.Msg{Subject: e.prefix + topic, Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	out, err := e.replayCmd("--from-seq", "1").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "returned unroutable") {
		t.Fatalf("replay of an unroutable message: %v, want exit 1 saying it was returned:\n%s", err, out)
	}
	if s := decodeReplay(t, out); s.Record.Position != 10 || s.Failed != 1 || s.Finished {
		t.Fatalf("failed run: position %d, %d failed, finished %v; want 10, 1, unfinished", s.Record.Position, s.Failed, s.Finished)
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(e.queue, "unbound.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	if out, err := e.replayCmd().CombinedOutput(); err != nil {
		t.Fatalf("rerun: %v\n%s", err, out)
	}
	got, _ := e.drainQueue(time.Second)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	// Those after the returned one were confirmed, not recorded: sent again.
	if missing, extra, dupes := tally(want, got); missing > 0 || extra > 0 || dupes > 9 {
		t.Errorf("legacy queue: %d missing, %d extra, %d duplicates (at most the 9 after the returned one)", missing, extra, dupes)
	}
}

// Rows RabbitMQ still owed at the move to nats (in retry, or parked for
// amqp) reached JetStream during dual write, long before the period, and the
// cleanup finished them in it: a default run starts its window at them. The
// period is put after the stream's messages with explicit times.
func TestReplayStrandedAtTheMoveToNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.setTablePhase(phase.Dual)
	publish := func(id string) time.Time {
		m := &nats.Msg{Subject: e.prefix + "orders.stranded", Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		return time.Now() // the relay records nats_delivered_at after the PubAck
	}
	stranded, dual := uuid.NewString(), uuid.NewString()
	dualAt := publish(dual)
	strandedAt := publish(stranded)
	natsAt, dualAgainAt := strandedAt.Add(3*time.Minute), strandedAt.Add(10*time.Minute)
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO ` + e.table.Delivered() + ` (done_at, id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent) VALUES
			($1, 1, $2, $1, $1, true), ($3, 2, $4, NULL, $5, true)`,
			[]any{dualAt, dual, natsAt.Add(time.Second), stranded, strandedAt}},
		{`INSERT INTO ` + e.table.Side("phase_history") + ` (phase, changed_at, changed_by) VALUES ('nats', $1, 'test'), ('dual', $2, 'test')`,
			[]any{natsAt, dualAgainAt}},
	} {
		if _, err := e.pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	out, err := e.replayCmd().CombinedOutput()
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	sum := decodeReplay(t, out)
	if sum.Sent != 1 || sum.SkippedDelivered != 1 || !sum.Finished {
		t.Errorf("replay: %+v (window %s), want the stranded row sent, the dual-written one skipped", sum.Counts, sum.Record.Request)
	}
	got, _ := e.drainQueue(time.Second)
	if len(got) != 1 || got[stranded] != 1 {
		t.Errorf("legacy queue got %v, want %s once", got, stranded)
	}
}

// A message RabbitMQ can never take (a routing key over 255 bytes) is what
// the relay would park: the run logs it, counts it failed_permanent, and
// goes on to the end.
func TestReplayPassesOverAMessageRabbitMQCanNeverTake(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	want := map[string]bool{}
	for i := range 6 {
		topic, id := "orders.a", fmt.Sprintf("m-%02d", i)
		if i == 2 {
			topic = "orders." + strings.Repeat("x", 300)
		} else {
			want[id] = true
		}
		m := &nats.Msg{Subject: e.prefix + topic, Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	out, err := e.replayCmd("--from-seq", "1").CombinedOutput()
	if err != nil {
		t.Fatalf("replay: %v, want exit 0\n%s", err, out)
	}
	s := decodeReplay(t, out)
	if s.FailedPermanent != 1 || s.Record.FailedPermanent != 1 || s.Sent != 5 || s.Failed != 0 || !s.Finished || s.Record.Position != 6 {
		t.Errorf("replay: %+v, finished %v, position %d; want 5 sent, 1 failed permanent, finished at 6", s.Counts, s.Finished, s.Record.Position)
	}
	if !strings.Contains(string(out), "m-02") || !strings.Contains(string(out), "routing key longer than 255 bytes") {
		t.Errorf("the log does not name m-02 and why:\n%s", out)
	}
	var recorded int64
	if err := e.pool.QueryRow(ctx, `SELECT failed_permanent FROM `+e.table.Side("replay")).Scan(&recorded); err != nil || recorded != 1 {
		t.Errorf("recorded failed_permanent %d (%v), want 1", recorded, err)
	}
	got, _ := e.drainQueue(time.Second)
	if missing, extra, dupes := tally(want, got); missing > 0 || extra > 0 || dupes > 0 {
		t.Errorf("legacy queue: %d missing, %d extra, %d duplicates", missing, extra, dupes)
	}
}

// NATS blackholed in the middle of a replay: the run says it cannot read
// the stream, waits, and once NATS is back goes on to the end of its
// window; RabbitMQ gets every message once. The consumer's question "is
// anything left?" sent during the outage used to wait for ever.
func TestReplayRidesOutANATSOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	want := e.streamOrders(3000)
	px := newFaultProxy(t, "nats", hostOf(t, e.natsURL))
	cmd := e.replayCmd("--from-seq", "1", "--rate", "300")
	cmd.Env = append(cmd.Env, "RELAY_NATS_URL="+px.url(e.natsURL))
	out, done := startCmd(t, cmd)
	testenv.Eventually(t, 30*time.Second, func() bool { _, pos, _, ok := e.replayRecord(); return ok && pos > 0 }, "the replay made no progress")

	heal := px.inject("timeout", map[string]any{"timeout": 0}, "upstream", "downstream")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(out.String(), "read the stream from JetStream failed")
	}, "the replay did not say it cannot read the stream:\n%s", out)
	heal()
	awaitReplay(t, cmd, done, out, "NATS coming back")
	if s := decodeReplay(t, []byte(out.String())); !s.Finished || s.Record.Position != 3000 {
		t.Errorf("replay: finished %v at %d, want finished at 3000", s.Finished, s.Record.Position)
	}
	got, _ := e.drainQueue(time.Second)
	if missing, extra, dupes := tally(want, got); missing > 0 || extra > 0 || dupes > 0 {
		t.Errorf("legacy queue: %d missing, %d extra, %d duplicates", missing, extra, dupes)
	}
}

// The exchange deleted in the middle of a replay: RabbitMQ closes the
// channel (404), which the run names at once and waits out, sending again
// what it did not hear confirmed; once the exchange is declared again, it
// goes on to the end of its window. Nothing is passed over or counted
// failed; RabbitMQ gets every message, a copy more only within the batches
// in flight.
func TestReplayWaitsForADeletedExchange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	want := e.streamOrders(3000)
	const rate = 300
	cmd := e.replayCmd("--from-seq", "1", "--rate", fmt.Sprint(rate))
	out, done := startCmd(t, cmd)
	testenv.Eventually(t, 30*time.Second, func() bool { _, pos, _, ok := e.replayRecord(); return ok && pos > 0 }, "the replay made no progress")

	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDelete(e.exchange, false, false); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	named := fmt.Sprintf("no exchange '%s'", e.exchange)
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(out.String(), named) },
		"the replay did not name the missing exchange:\n%s", out)
	if took := time.Since(deleted); took > 2*time.Second {
		t.Errorf("the replay named the missing exchange %s after its deletion, want within 2 s", took)
	}
	_, held, _, _ := e.replayRecord()
	select {
	case err := <-done:
		t.Fatalf("the replay ended while the exchange was missing: %v\n%s", err, out)
	case <-time.After(3 * time.Second):
	}
	if _, pos, _, ok := e.replayRecord(); !ok || pos > held+rate {
		t.Errorf("the run moved from %d to %d (unfinished %v) while the exchange was missing", held, pos, ok)
	}
	if err := ch.ExchangeDeclare(e.exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(e.queue, "orders.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	awaitReplay(t, cmd, done, out, "the exchange coming back")
	s := decodeReplay(t, []byte(out.String()))
	if !s.Finished || s.Record.Position != 3000 || s.Failed != 0 || s.Record.FailedPermanent != 0 {
		t.Errorf("replay: finished %v at %d, %d failed, %d failed for good; want finished at 3000, none failed", s.Finished, s.Record.Position, s.Failed, s.Record.FailedPermanent)
	}
	got, _ := e.drainQueue(time.Second)
	bound := replay.DefaultInFlight * max(1, rate/10)
	if missing, extra, dupes := tally(want, got); missing > 0 || extra > 0 || dupes > bound {
		t.Errorf("legacy queue: %d missing, %d extra, %d duplicates (bound %d)", missing, extra, dupes, bound)
	}
}
