package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// `relayd backfill` runs beside a relayd on the same host with the same
// environment: it does not take RELAY_METRICS_ADDR, which the relayd
// listens on, and serves its own metrics on --metrics-addr only.
func TestBackfillBesideRelayMetricsPort(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.startRelay("relayd", "RELAY_METRICS_ADDR="+addr)

	cmd := e.backfillCmd()
	cmd.Env = append(cmd.Env, "RELAY_METRICS_ADDR="+addr)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("backfill beside a relayd on RELAY_METRICS_ADDR=%s: %v\n%s", addr, err, out)
	}

	own := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd, out, done := e.startBackfill(t, "", "--follow", "--metrics-addr", own)
	var body string
	testenv.Eventually(t, 30*time.Second, func() bool {
		select {
		case err := <-done:
			t.Fatalf("backfill --follow exited: %v\n%s", err, out.String())
		default:
		}
		resp, err := http.Get("http://" + own + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return true
	}, "backfill --metrics-addr %s not serving", own)
	if !strings.Contains(body, "relayd_backfill_moved_total") {
		t.Errorf("--metrics-addr serves no relayd_backfill_* metrics:\n%s", body)
	}
	requireOutboxLabel(t, own, e.table.String())
	cmd.Process.Kill()
}
