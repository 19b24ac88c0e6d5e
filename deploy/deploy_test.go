// Package deploy holds the Grafana dashboard and the Prometheus alert rules
// shipped with relayd; its test checks them with the real tools.
package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/metrics"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (CI=true, not skipping): install Debian's prometheus package")
		}
		t.Skip("promtool not found: install Debian's prometheus package to check the alert rules")
	}
	return p
}

func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every relayd metric the dashboard and the alerts query is one relayd
// actually exports: a renamed metric cannot silently blank a panel.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewRelay(reg, "test")
	metrics.NewOutbox(reg).Set(nil)
	m.PublishFailed("amqp", nil)
	m.Parked("amqp")
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
	}
	// Collectors that export nothing until their first read.
	for _, name := range []string{"relayd_outbox_lag_seconds", "relayd_outbox_pending_messages", "relayd_parked_messages", "relayd_outbox_held_keys",
		"relayd_outbox_retrying_messages", "relayd_outbox_stats_timestamp_seconds"} {
		exported[name] = true
	}

	dash, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	if len(d.Panels) < 6 {
		t.Fatalf("dashboard has %d panels", len(d.Panels))
	}
	alerts, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			text.WriteString(tg.Expr + "\n")
		}
	}
	text.Write(alerts)
	re := regexp.MustCompile(`relayd_[a-z_]+`)
	seen := 0
	for _, name := range re.FindAllString(text.String(), -1) {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if !exported[base] {
			t.Errorf("%s is queried but relayd does not export it", name)
		}
		seen++
	}
	if seen < 10 {
		t.Fatalf("only %d metric references found", seen)
	}
}
