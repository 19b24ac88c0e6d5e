package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
	"github.com/relayd/relayd/relay"
)

// A row that can never be published is parked with its reason and does not
// hold the others; `relayd outbox parked` lists it, and once the cause is
// fixed `relayd outbox retry` puts it back — while the relay runs.
func TestParkedRowsListedAndRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startRelay("relay")
	ctx := context.Background()
	var badID int64
	if err := e.pool.QueryRow(ctx, `INSERT INTO `+e.table.Ident()+` (topic, payload, headers) VALUES ('orders.bad', '\x00', '{"n": 1}') RETURNING id`).Scan(&badID); err != nil {
		t.Fatal(err)
	}
	var good []outbox.Message
	for i := range 50 {
		good = append(good, outbox.Message{Topic: "orders.good", Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := e.writer.Write(ctx, e.pool, good...); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		var done, parked int
		e.pool.QueryRow(ctx, `SELECT count(done_at), count(*) FILTER (WHERE amqp_parked_at IS NOT NULL AND nats_parked_at IS NOT NULL) FROM `+e.table.Ident()).Scan(&done, &parked)
		return done == 50 && parked == 1
	}, "good rows not delivered / bad row not parked on both targets")

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(relaydBin, append([]string{"outbox"}, args...)...)
		cmd.Env = e.relayEnv()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("relayd outbox %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var rows []relay.ParkedRow
	if err := json.Unmarshal([]byte(run("parked", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != badID || len(rows[0].Targets) != 2 || !strings.Contains(rows[0].Targets[0].Reason, `"n" is not a string`) {
		t.Fatalf("parked: %+v; want the bad row on both targets with its reason", rows)
	}
	if out := run("parked", "--target", "nats"); !strings.Contains(out, "orders.bad") || strings.Count(out, "orders.bad") != 1 {
		t.Fatalf("parked --target nats: %q", out)
	}

	// The producer's bug is fixed in place; put the row back.
	if _, err := e.pool.Exec(ctx, `UPDATE `+e.table.Ident()+` SET headers = '{"n": "1"}' WHERE id = $1`, badID); err != nil {
		t.Fatal(err)
	}
	if out := run("retry", "--id", fmt.Sprint(badID)); !strings.HasPrefix(out, "2 parked") {
		t.Fatalf("retry: %q, want 2 deliveries (amqp and nats) put back", out)
	}
	e.waitDelivered(30 * time.Second)
	if out := run("parked"); strings.Contains(out, "orders.bad") {
		t.Fatalf("still parked after retry: %q", out)
	}

	cmd := exec.Command(relaydBin, "outbox", "retry")
	cmd.Env = e.relayEnv()
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("retry without --id or --all: exit %d %q, want 2", cmd.ProcessState.ExitCode(), out)
	}
}
