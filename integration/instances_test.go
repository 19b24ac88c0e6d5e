package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// A stopping relay keeps its row in <table>_instances while its batches in
// flight run to their end: the replay, the backfill and the cutover check
// read those rows for the phases still running. It removes the row as it
// exits.
func TestStoppingRelayReportsUntilItsBatchesEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	px := newFaultProxy(t, "rabbitmq", hostOf(t, e.amqpURL))
	app := testenv.Name("relayd")
	sep := "?"
	if strings.Contains(e.dbURL, "?") {
		sep = "&"
	}
	r := e.startRelay("relay", "RELAY_AMQP_URL="+px.url(e.amqpURL), "RELAY_PUBLISH_TIMEOUT=5s", "RELAY_SHUTDOWN_TIMEOUT=30s",
		"RELAY_DATABASE_URL="+e.dbURL+sep+"application_name="+app)
	reported := func() bool {
		in, err := phase.Running(ctx, e.pool, e.table)
		if err != nil {
			t.Fatal(err)
		}
		return len(in) == 1
	}
	testenv.Eventually(t, 30*time.Second, reported, "the relay did not report itself")

	// RabbitMQ's confirms stop coming back: the next batch holds its rows
	// for RELAY_PUBLISH_TIMEOUT once JetStream has them.
	heal := px.inject("timeout", map[string]any{"timeout": 0}, "downstream")
	defer heal()
	if _, err := e.writer.Write(ctx, e.pool, outbox.Message{Topic: "test.stop", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.streamIDs()) == 1 }, "JetStream did not get the row")
	inFlight := func() bool {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if !inFlight() {
		t.Fatal("no batch in flight while RabbitMQ withholds its confirms")
	}

	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	polls := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute) // well past RELAY_SHUTDOWN_TIMEOUT
	for exited := false; !exited; {
		select {
		case <-r.done:
			exited = true
		case <-deadline:
			t.Fatalf("relayd did not exit a minute after SIGTERM (%d polls)\n%s", polls, r.out.String())
		case <-tick.C:
			// The row read first, the batch after: a row gone while the
			// batch was in flight at both moments left before it ended.
			if !reported() && inFlight() {
				t.Fatalf("the relay's row went while its batch was still in flight (poll %d)", polls)
			}
			polls++
		}
	}
	if polls < 10 {
		t.Fatalf("relayd exited after %d polls, before its batch could time out", polls)
	}
	if reported() {
		t.Error("the relay's row is still there after it exited")
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("relayd exited %d\n%s", code, r.out.String())
	}
	t.Logf("%d polls while the batch ran out", polls)
}
