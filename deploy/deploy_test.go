// Package deploy holds the Grafana dashboard and the Prometheus alert rules
// shipped with relayd; its test checks them with the real tools.
package deploy

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/metrics"
	"github.com/relayd/relayd/relay"
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

// exportedMetrics returns every metric relayd run, relayd backfill and
// package inbox register, with its type ("counter", "gauge", "histogram"),
// and Prometheus's own up.
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.NewRelay(reg, "test")
	// Figures read once: the backlog gauges export nothing before.
	metrics.NewOutbox(reg).Set([]relay.TargetStats{{Target: relay.TargetAMQP, Pending: 1}})
	metrics.NewPostgres(reg).Set(relay.PostgresHealth{
		Horizon: []relay.HorizonHolder{{Kind: "snapshot", Age: time.Hour, AgeKnown: true}},
		Tables:  []relay.TableHealth{{Table: "outbox"}}})
	m.PublishFailed("amqp", nil)
	m.Parked("amqp")
	// The pool connects lazily: New registers the counters, nothing dials.
	pool, err := pgxpool.New(context.Background(), "postgres://deploy-test.invalid/unused")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := inbox.New(pool, inbox.Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]string{"up": "gauge"}
	for _, f := range fams {
		exported[f.GetName()] = strings.ToLower(dto.MetricType_name[int32(f.GetType())])
	}
	// relayd backfill registers its own in package main: read from source.
	backfill := sourceMetrics(t, "../cmd/relayd")
	if len(backfill) == 0 {
		t.Fatal("found no metric registered in cmd/relayd: the source scan is broken")
	}
	for name, typ := range backfill {
		exported[name] = typ
	}
	return exported
}

// sourceMetrics finds prometheus.CounterOpts, GaugeOpts and HistogramOpts
// literals in the non-test Go files of dir and returns their names.
func sourceMetrics(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{"CounterOpts": "counter", "GaugeOpts": "gauge", "HistogramOpts": "histogram"}
	found := map[string]string{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || kinds[sel.Sel.Name] == "" {
				return true
			}
			for _, el := range lit.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if id, isID := kv.Key.(*ast.Ident); ok && isID && id.Name == "Name" {
					if s, ok := kv.Value.(*ast.BasicLit); ok {
						name, _ := strconv.Unquote(s.Value)
						found[name] = kinds[sel.Sel.Name]
					}
				}
			}
			return true
		})
	}
	return found
}

// dashPanel is a Grafana panel, a row's nested panels included.
type dashPanel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Properties []struct {
				ID string `json:"id"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

type dashboard struct {
	raw        []byte
	panels     []dashPanel // flattened: rows' panels beside them
	variables  []json.RawMessage
	varNames   []string
	panelsJSON json.RawMessage
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	raw, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     json.RawMessage `json:"panels"`
		Templating struct {
			List []json.RawMessage `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	var top []dashPanel
	if err := json.Unmarshal(d.Panels, &top); err != nil {
		t.Fatalf("dashboard panels: %v", err)
	}
	out := &dashboard{raw: raw, variables: d.Templating.List, panelsJSON: d.Panels}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			out.panels = append(out.panels, p)
			walk(p.Panels)
		}
	}
	walk(top)
	for _, v := range d.Templating.List {
		var nv struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(v, &nv); err != nil || nv.Name == "" {
			t.Fatalf("template variable without a name: %s", v)
		}
		out.varNames = append(out.varNames, nv.Name)
	}
	return out
}

// exprs returns every panel query with its panel.
func (d *dashboard) exprs() map[string]dashPanel {
	out := map[string]dashPanel{}
	for _, p := range d.panels {
		for _, tg := range p.Targets {
			out[tg.Expr] = p
		}
	}
	return out
}

var metricRef = regexp.MustCompile(`\b(relayd_[a-z0-9_]+|up)\b(\{[^}]*\})?`)

// Every metric the dashboard (panels and variables) and the alerts query is
// one relayd, its backfill or package inbox registers: a renamed metric
// cannot silently blank a panel. _bucket, _sum and _count only of
// histograms.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	d := loadDashboard(t)
	alerts, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for expr := range d.exprs() {
		text.WriteString(expr + "\n")
	}
	for _, v := range d.variables { // label_values(...) queries
		text.Write(v)
		text.WriteString("\n")
	}
	text.Write(alerts)
	seen := 0
	for _, m := range metricRef.FindAllStringSubmatch(text.String(), -1) {
		name := m[1]
		if exported[name] == "" {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
			if base == name || exported[base] != "histogram" {
				t.Errorf("%s is queried but relayd does not export it", name)
			}
		}
		seen++
	}
	if seen < 30 {
		t.Fatalf("only %d metric references found", seen)
	}
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z_]\w*)(?::[^}]*)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]`)

// refs returns the variables s refers to, Grafana's own ($__interval, ...)
// left out.
func refs(s string) map[string]bool {
	out := map[string]bool{}
	for _, m := range varRef.FindAllStringSubmatch(s, -1) {
		name := m[1] + m[2] + m[3]
		if !strings.HasPrefix(name, "__") {
			out[name] = true
		}
	}
	return out
}

// Every template variable the dashboard defines is used (by a panel or by
// another variable's query), and every one used is defined.
func TestDashboardVariables(t *testing.T) {
	d := loadDashboard(t)
	used := refs(string(d.panelsJSON))
	for i, v := range d.variables {
		for name := range refs(string(v)) {
			if name == d.varNames[i] {
				t.Errorf("variable %s refers to itself", name)
			}
			used[name] = true
		}
	}
	for name := range used {
		if !slices.Contains(d.varNames, name) {
			t.Errorf("$%s is used but not defined (defined: %v)", name, d.varNames)
		}
	}
	for _, name := range d.varNames {
		if !used[name] {
			t.Errorf("variable %s is defined but not used", name)
		}
	}
	for _, want := range []string{"datasource", "job", "instance"} {
		if !slices.Contains(d.varNames, want) {
			t.Errorf("no %s variable (defined: %v)", want, d.varNames)
		}
	}
}

// Every series a panel reads is chosen by the job and instance variables:
// no scrape job name is assumed.
func TestDashboardSelectsByJobAndInstance(t *testing.T) {
	d := loadDashboard(t)
	if regexp.MustCompile(`job\s*=\s*\\?"`).Match(d.raw) {
		t.Error(`the dashboard hard-codes a job (job="..."): select with job=~"$job"`)
	}
	for expr, p := range d.exprs() {
		for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
			if !strings.Contains(m[2], `job=~"$job"`) || !strings.Contains(m[2], `instance=~"$instance"`) {
				t.Errorf("panel %q: %s%s is not selected by job=~\"$job\" and instance=~\"$instance\"", p.Title, m[1], m[2])
			}
		}
	}
}

// The table-wide gauges come from each instance's last read of the outbox:
// as the alerts do, the panels leave out instances whose read is over 120 s
// old (an instance that cannot read Postgres extrapolates its last figures).
func TestDashboardLeavesStaleInstancesOut(t *testing.T) {
	d := loadDashboard(t)
	fresh := regexp.MustCompile(`and on \(instance, job\) \(time\(\) - relayd_outbox_stats_timestamp_seconds\{[^}]*\} < 120\)`)
	checked := 0
	for expr, p := range d.exprs() {
		if !regexp.MustCompile(`relayd_outbox_(lag_seconds|pending_messages|retrying_messages|held_keys)\b|relayd_parked_messages\b`).MatchString(expr) {
			continue
		}
		checked++
		if !fresh.MatchString(expr) {
			t.Errorf("panel %q: %s does not leave out instances with stale stats", p.Title, expr)
		}
	}
	if checked < 5 {
		t.Errorf("only %d queries of the outbox gauges found", checked)
	}
}

// One unit a panel, and queries that measure it: seconds panels query
// seconds, rate panels rates, count panels neither.
func TestDashboardPanelUnits(t *testing.T) {
	d := loadDashboard(t)
	for _, p := range d.panels {
		if p.Type == "row" {
			continue
		}
		for _, o := range p.FieldConfig.Overrides {
			for _, prop := range o.Properties {
				if prop.ID == "unit" {
					t.Errorf("panel %q overrides the unit of some series: one unit a panel", p.Title)
				}
			}
		}
		for _, tg := range p.Targets {
			e := tg.Expr
			bad := ""
			switch p.FieldConfig.Defaults.Unit {
			case "s":
				if !strings.Contains(e, "_seconds") {
					bad = "is not in seconds"
				}
			case "ops":
				if !strings.Contains(e, "rate(") {
					bad = "is not a rate"
				}
			case "short":
				if strings.Contains(e, "rate(") || strings.Contains(e, "histogram_quantile") || strings.HasPrefix(e, "time() -") {
					bad = "is a rate or a duration, not a count"
				}
			default:
				bad = "is in an unexpected unit " + strconv.Quote(p.FieldConfig.Defaults.Unit)
			}
			if bad != "" {
				t.Errorf("panel %q (unit %q): %s %s", p.Title, p.FieldConfig.Defaults.Unit, e, bad)
			}
		}
	}
}

// The dashboard shows what on-call needs besides the lag: late confirms,
// stats freshness, the versions running, the backfill and the inbox.
func TestDashboardHasPanelsFor(t *testing.T) {
	d := loadDashboard(t)
	var all strings.Builder
	for expr := range d.exprs() {
		all.WriteString(expr + "\n")
	}
	for _, metric := range []string{
		"relayd_outbox_lag_seconds", "relayd_late_confirms_total", "relayd_outbox_stats_timestamp_seconds", "relayd_build_info",
		"relayd_backfill_moved_total", "relayd_backfill_queue_depth_at_start", "relayd_inbox_processed_total", "relayd_inbox_errors_total",
	} {
		if !strings.Contains(all.String(), metric) {
			t.Errorf("no panel queries %s", metric)
		}
	}
}
