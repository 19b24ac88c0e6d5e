package integration

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
)

// relayd runs a one-shot command of this test's and returns its exit code,
// stdout and stderr.
func (e *env) relayd(args ...string) (code int, stdout, stderr string) {
	e.t.Helper()
	cmd := exec.Command(relaydBin, args...)
	cmd.Env = e.relayEnv("RELAY_METRICS_ADDR=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	dieWithTest(cmd)
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		e.t.Fatalf("relayd %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// The cutover check fails on a running relay pinned to amqp, by name, and
// not once it reports dual; phase set nats refuses while the legacy queue
// has messages, and while the JetStream consumer has some pending, saying
// which condition and how to override; --force moves, recorded as forced.
func TestPhaseSetNATSGuardRails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const durable = "billing"
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second}); err != nil {
		t.Fatal(err)
	}
	checkFlags := []string{"--consumer", durable, "--queue", e.queue, "--quiet-period", "1s"}
	beat := func(p phase.Name, pinned bool) {
		t.Helper()
		if err := phase.Beat(ctx, e.pool, e.table, phase.Instance{Instance: "it-host:4242", Phase: p, Pinned: pinned, Version: "test", StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	history := func() []phase.Change {
		t.Helper()
		h, err := phase.History(ctx, e.pool, e.table)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	phasesLine := func(out string) string {
		for line := range strings.Lines(out) {
			if strings.Contains(line, cutover.CondPhases) {
				return line
			}
		}
		t.Fatalf("no %s line in:\n%s", cutover.CondPhases, out)
		return ""
	}

	if code, out, errOut := e.relayd("phase", "set", "dual", "--reason", "dual write"); code != 0 {
		t.Fatalf("phase set dual: exit %d\n%s%s", code, out, errOut)
	}

	// A relay pinned to amqp: the check fails naming it.
	beat(phase.AMQP, true)
	code, out, errOut := e.relayd(append([]string{"cutover", "check"}, checkFlags...)...)
	if l := phasesLine(out); code != 1 || !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "it-host:4242 runs amqp (pinned by RELAY_TARGETS)") {
		t.Errorf("cutover check with a relay pinned to amqp: exit %d, want 1 and a FAIL naming it:\n%s%s", code, out, errOut)
	}
	code, _, errOut = e.relayd(append([]string{"phase", "set", "nats"}, checkFlags...)...)
	if code != 1 || !strings.Contains(errOut, `condition "relayd phases"`) {
		t.Errorf("phase set nats with a relay pinned to amqp: exit %d, %q; want 1 naming relayd phases", code, errOut)
	}
	// It reports dual: nothing else stands in the way.
	beat(phase.Dual, false)
	code, out, errOut = e.relayd(append([]string{"cutover", "check"}, checkFlags...)...)
	if l := phasesLine(out); code != 0 || !strings.HasPrefix(l, "PASS") || strings.Contains(l, "it-host:4242") || !strings.Contains(l, "1 relay reports: 1 dual") {
		t.Errorf("cutover check with the relay in dual: exit %d, want 0 and relayd phases passing:\n%s%s", code, out, errOut)
	}

	refused := func(what, wantCond, wantDetail string) {
		t.Helper()
		beat(phase.Dual, false)
		code, out, errOut := e.relayd(append([]string{"phase", "set", "nats", "--reason", "cutover"}, checkFlags...)...)
		if code != 1 || !strings.Contains(errOut, "refused, nothing recorded") || !strings.Contains(errOut, `condition "`+wantCond+`"`) ||
			!strings.Contains(errOut, wantDetail) || !strings.Contains(errOut, "--force") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("phase set nats while %s: exit %d, stderr %q; want 1 and one paragraph naming %q (%s) and --force\n%s", what, code, errOut, wantCond, wantDetail, out)
		}
		t.Logf("phase set nats while %s (exit %d):\n%s%s", what, code, out, errOut)
		if h := history(); h[len(h)-1].Phase != phase.Dual {
			t.Errorf("phase set nats refused while %s, yet the history says %+v", what, h[len(h)-1])
		}
	}

	// The legacy queue has a message.
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.PublishWithContext(ctx, "", e.queue, false, false, amqp.Publishing{Body: []byte("left behind")}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		q, err := ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
		return err == nil && q.Messages == 1
	}, "the message did not reach the queue")
	refused("the legacy queue has a message", cutover.CondQueue, "1 ready")
	if _, err := ch.QueuePurge(e.queue, false); err != nil {
		t.Fatal(err)
	}

	// The JetStream consumer has a message pending.
	if _, err := e.js.Publish(ctx, e.prefix+"orders.created", []byte("unread")); err != nil {
		t.Fatal(err)
	}
	refused("the consumer has a message pending", cutover.CondConsumer, "pending 1")

	// --force moves all the same, and says what it skipped.
	code, out, errOut = e.relayd("phase", "set", "nats", "--force", "--reason", "consumers moved by hand")
	if code != 0 || !strings.Contains(out, "phase dual -> nats") || !strings.Contains(out, "forced: the cutover check was not run") {
		t.Fatalf("phase set nats --force: exit %d\n%s%s", code, out, errOut)
	}
	h := history()
	if last := h[len(h)-1]; len(h) != 2 || last.Phase != phase.NATS || !last.Forced || last.Reason != "consumers moved by hand" {
		t.Errorf("history %+v: want dual, then nats forced with its reason", h)
	}
}
