package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
)

// setTablePhase runs `relayd phase set`, forced: the guard rails have tests
// of their own.
func (e *env) setTablePhase(p phase.Name) {
	e.t.Helper()
	cmd := exec.Command(relaydBin, "phase", "set", string(p), "--force", "--reason", "test")
	cmd.Env = e.relayEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("relayd phase set %s: %v\n%s", p, err, out)
	}
}

// waitInstances waits until n relays report they run p.
func (e *env) waitInstances(n int, p phase.Name) {
	e.t.Helper()
	var got []phase.Instance
	testenv.Eventually(e.t, 30*time.Second, func() bool {
		var err error
		if got, err = phase.Running(context.Background(), e.pool, e.table); err != nil {
			e.t.Fatal(err)
		}
		return len(got) == n && len(phase.Astray(got, p)) == 0
	}, "want %d relays in phase %s: %+v", n, p, lazyString(func() string { return fmt.Sprint(got) }))
}

// Three relays follow `relayd phase set` from amqp to dual to nats under
// producer load, without a restart. Rows committed once every relay runs
// dual reach the stream exactly once, and RabbitMQ until the move to nats;
// rows committed once every relay runs nats reach the stream only. A relay
// pinned to amqp is reported by its metrics and by the cutover check.
func TestRelaysFollowTheSharedPhase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setTablePhase(phase.AMQP)
	// Two workers each: four relays of eight would hold half of the shared
	// Postgres's 100 connections, with other tests running beside this one.
	for i := range 3 {
		e.startRelay(fmt.Sprintf("relay-%d", i), "RELAY_WORKERS=2")
	}
	pinnedAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	pinned := e.startRelay("relay-pinned", "RELAY_WORKERS=2", "RELAY_TARGETS=amqp", "RELAY_METRICS_ADDR="+pinnedAddr)
	e.waitInstances(4, phase.AMQP)
	load := e.startLoad(5, 20*time.Millisecond) // ~250 rows/s
	produced := func() int { load.mu.Lock(); defer load.mu.Unlock(); return len(load.ids) }
	waitProduced := func(n int) {
		testenv.Eventually(t, 30*time.Second, func() bool { return produced() >= n }, "the producers wrote fewer than %d rows", n)
	}
	waitProduced(300)

	e.setTablePhase(phase.Dual)
	testenv.Eventually(t, 30*time.Second, func() bool {
		in, err := phase.Running(context.Background(), e.pool, e.table)
		return err == nil && len(in) == 4 && len(phase.Astray(in, phase.Dual)) == 1
	}, "the three relays did not follow to dual")
	// It reads the table's phase on its own 2 s beat.
	testenv.Eventually(t, 10*time.Second, func() bool { return scrape(t, pinnedAddr, "relayd_phase_mismatch")[""] == 1 },
		"pinned relay: relayd_phase_mismatch not 1")
	if got := scrapeBy(t, pinnedAddr, "relayd_phase", "phase"); got["amqp"] != 1 || got["dual"] != 0 {
		t.Errorf("pinned relay: relayd_phase %v, want amqp", got)
	}
	st, err := e.js.Stream(context.Background(), e.stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := e.relayd("cutover", "check", "--consumer", "billing", "--queue", e.queue, "--quiet-period", "1s")
	name := fmt.Sprintf(":%d runs amqp (pinned by RELAY_TARGETS)", pinned.cmd.Process.Pid)
	if code != 1 || !strings.Contains(out, cutover.CondPhases) || !strings.Contains(out, name) {
		t.Errorf("cutover check with a relay pinned to amqp: exit %d, want 1 and %s naming it (%s):\n%s%s", code, cutover.CondPhases, name, out, errOut)
	}
	if code := pinned.stop(30 * time.Second); code != 0 {
		t.Fatalf("pinned relay exit %d", code)
	}
	// From here every relay runs dual: rows committed now reach both.
	allDual := produced()
	waitProduced(allDual + 500)

	beforeNATS := produced()
	e.setTablePhase(phase.NATS)
	e.waitInstances(3, phase.NATS)
	allNATS := produced()
	waitProduced(allNATS + 500)
	ids := load.halt()

	testenv.Eventually(t, 60*time.Second, func() bool {
		var owed int
		e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pending(e.table)+` WHERE nats_delivered_at IS NULL`).Scan(&owed)
		return owed == 0
	}, "rows still owed to JetStream")
	stream, queue := e.streamIDs(), e.queueIDs(time.Second)
	committed := map[string]bool{}
	for _, id := range ids {
		committed[id] = true
	}
	for id := range stream {
		if !committed[id] {
			t.Errorf("stream holds %s, which no producer committed", id)
		}
	}
	var amqpDupes int
	for i, id := range ids {
		switch {
		case i >= allDual && stream[id] != 1:
			t.Errorf("row %d (%s), committed in dual write or later, is in the stream %d times", i, id, stream[id])
		case i < allDual && stream[id] > 1:
			t.Errorf("row %d (%s) is in the stream %d times", i, id, stream[id])
		}
		switch {
		case i < beforeNATS && queue[id] == 0:
			t.Errorf("row %d (%s), committed before the move to nats, never reached RabbitMQ", i, id)
		case i >= allNATS && queue[id] != 0:
			t.Errorf("row %d (%s), committed once every relay ran nats, reached RabbitMQ", i, id)
		}
		amqpDupes += max(0, queue[id]-1)
	}
	t.Logf("%d rows: %d before every relay ran dual, %d before the move to nats, %d after every relay ran nats; RabbitMQ duplicates %d",
		len(ids), allDual, beforeNATS, len(ids)-allNATS, amqpDupes)
}
