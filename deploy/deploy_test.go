// Package deploy holds the Grafana dashboard and the Prometheus alert rules
// shipped with relayd; its test checks them with the real tools.
package deploy

import (
	"context"
	"encoding/json"
	"fmt"
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
	"sigs.k8s.io/yaml"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/metrics"
	"github.com/relayd/relayd/internal/pghealth"
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

// runbookURL is where every alert's runbook_url points: a section of
// docs/alerts.md, by GitHub's anchor for its heading.
const runbookURL = "https://github.com/relayd/relayd/blob/main/docs/alerts.md#"

// alertRule is a rule of alerts.yml, with what on-call reads of it.
type alertRule struct {
	Alert       string            `json:"alert"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func readAlertRules(t *testing.T) []alertRule {
	t.Helper()
	data, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	var rules []alertRule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" { // recording rules have no runbook
				rules = append(rules, r)
			}
		}
	}
	return rules
}

// runbookSections returns the level-2 headings of docs/alerts.md, code
// blocks left out: one section per alert.
func runbookSections(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../docs/alerts.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fence := false
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if h, ok := strings.CutPrefix(line, "## "); ok && !fence {
			out = append(out, strings.TrimSpace(h))
		}
	}
	return out
}

// githubAnchor is GitHub's anchor for a heading (as cmd/relayd's docs test
// computes it).
func githubAnchor(heading string) string {
	slug := regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(strings.ToLower(heading), "")
	return strings.ReplaceAll(slug, " ", "-")
}

// ruleRunbookProblems says what rule lacks: a severity, a summary, a
// description, or a runbook_url to its own section of docs/alerts.md.
func ruleRunbookProblems(r alertRule, sections []string) []string {
	var out []string
	if s := r.Labels["severity"]; s != "page" && s != "ticket" {
		out = append(out, fmt.Sprintf("%s: severity %q, want page or ticket", r.Alert, s))
	}
	for _, a := range []string{"summary", "description"} {
		if strings.TrimSpace(r.Annotations[a]) == "" {
			out = append(out, fmt.Sprintf("%s: no %s annotation", r.Alert, a))
		}
	}
	if !slices.Contains(sections, r.Alert) {
		out = append(out, fmt.Sprintf("%s: docs/alerts.md has no section \"## %s\"", r.Alert, r.Alert))
	}
	anchors := map[string]bool{}
	for _, s := range sections {
		anchors[githubAnchor(s)] = true
	}
	url := r.Annotations["runbook_url"]
	anchor, ok := strings.CutPrefix(url, runbookURL)
	switch {
	case !ok:
		out = append(out, fmt.Sprintf("%s: runbook_url %q, want %s%s", r.Alert, url, runbookURL, githubAnchor(r.Alert)))
	case !anchors[anchor]:
		out = append(out, fmt.Sprintf("%s: runbook_url %q: docs/alerts.md has no heading #%s", r.Alert, url, anchor))
	case anchor != githubAnchor(r.Alert):
		out = append(out, fmt.Sprintf("%s: runbook_url %q points at another alert's section, want #%s", r.Alert, url, githubAnchor(r.Alert)))
	}
	return out
}

// runbookSectionProblems names the sections of docs/alerts.md that are no
// rule's, and rules named twice.
func runbookSectionProblems(rules []alertRule, sections []string) []string {
	var out []string
	named := map[string]int{}
	for _, r := range rules {
		named[r.Alert]++
	}
	for name, n := range named {
		if n > 1 {
			out = append(out, fmt.Sprintf("alerts.yml: %d rules named %s", n, name))
		}
	}
	for _, s := range sections {
		if named[s] == 0 {
			out = append(out, fmt.Sprintf("docs/alerts.md: section %q names no rule of alerts.yml", s))
		}
	}
	return out
}

// Every alert has a severity, a summary, a description and a runbook_url to
// its section of docs/alerts.md; every section there is an alert's.
func TestRunbookCoversEveryAlert(t *testing.T) {
	rules, sections := readAlertRules(t), runbookSections(t)
	if len(rules) < 10 || len(sections) < 10 {
		t.Fatalf("found %d alerts and %d runbook sections: the reading is broken", len(rules), len(sections))
	}
	for _, r := range rules {
		t.Run(r.Alert, func(t *testing.T) {
			for _, p := range ruleRunbookProblems(r, sections) {
				t.Error(p)
			}
		})
	}
	for _, p := range runbookSectionProblems(rules, sections) {
		t.Error(p)
	}
}

// Each way of breaking the runbook links fails the checks above.
func TestRunbookChecksCatchBreakage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(rules []alertRule, sections []string) []string // returns the sections
		want    string
	}{
		{"no severity", func(r []alertRule, s []string) []string { delete(r[0].Labels, "severity"); return s }, "severity"},
		{"another severity", func(r []alertRule, s []string) []string { r[0].Labels["severity"] = "critical"; return s }, "severity"},
		{"no summary", func(r []alertRule, s []string) []string { delete(r[0].Annotations, "summary"); return s }, "no summary"},
		{"no description", func(r []alertRule, s []string) []string { r[0].Annotations["description"] = " "; return s }, "no description"},
		{"no runbook_url", func(r []alertRule, s []string) []string { delete(r[0].Annotations, "runbook_url"); return s }, "runbook_url"},
		{"runbook_url elsewhere", func(r []alertRule, s []string) []string {
			r[0].Annotations["runbook_url"] = "https://example.com/alerts#" + githubAnchor(r[0].Alert)
			return s
		}, "runbook_url"},
		{"anchor of no heading", func(r []alertRule, s []string) []string { r[0].Annotations["runbook_url"] += "-x"; return s }, "no heading"},
		{"another alert's section", func(r []alertRule, s []string) []string {
			r[0].Annotations["runbook_url"] = r[1].Annotations["runbook_url"]
			return s
		}, "another alert's section"},
		{"section gone", func(r []alertRule, s []string) []string { return slices.Delete(s, 0, 1) }, "no section"},
		{"section of no rule", func(r []alertRule, s []string) []string { return append(s, "RelaydRetired") }, "names no rule"},
		{"rule named twice", func(r []alertRule, s []string) []string { r[1].Alert = r[0].Alert; return s }, "rules named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := readAlertRules(t)
			sections := tc.breakIt(rules, runbookSections(t))
			var problems []string
			for _, r := range rules {
				problems = append(problems, ruleRunbookProblems(r, sections)...)
			}
			problems = append(problems, runbookSectionProblems(rules, sections)...)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("broken (%s), the checks found %q; want a problem saying %q", tc.name, problems, tc.want)
			}
		})
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
	metrics.NewPostgres(reg).Set(pghealth.Health{
		Horizon: []pghealth.Holder{{Kind: "snapshot", Age: time.Hour, AgeKnown: true}},
		Tables:  []pghealth.Table{{Table: "outbox"}}})
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

// dashboardFile is the Grafana dashboard, in the kustomization that makes it
// a ConfigMap.
const dashboardFile = "kubernetes/dashboard/relayd-dashboard.json"

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
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
	for _, want := range []string{"datasource", "namespace", "job", "service", "outbox", "instance"} {
		if !slices.Contains(d.varNames, want) {
			t.Errorf("no %s variable (defined: %v)", want, d.varNames)
		}
	}
}

// namespace and outbox list the label's values, each under the variables
// before it, with an All of .*: that also matches a series without the label
// (no namespace outside Kubernetes, an inbox without outbox).
func TestDashboardNamespaceAndOutboxVariables(t *testing.T) {
	d := loadDashboard(t)
	chained := map[string][]string{"namespace": nil, "job": {"namespace"}, "service": {"namespace", "job"}, "outbox": {"namespace", "job", "service"}, "instance": {"namespace", "job", "service", "outbox"}}
	for i, raw := range d.variables {
		after, ok := chained[d.varNames[i]]
		if !ok {
			continue
		}
		var v struct {
			Name       string `json:"name"`
			IncludeAll bool   `json:"includeAll"`
			AllValue   string `json:"allValue"`
			Query      struct {
				Query string `json:"query"`
			} `json:"query"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("variable %s: %v", d.varNames[i], err)
		}
		delete(chained, v.Name)
		if !strings.HasPrefix(v.Query.Query, "label_values(") || !strings.HasSuffix(v.Query.Query, ", "+v.Name+")") {
			t.Errorf("variable %s: query %q, want label_values(..., %s)", v.Name, v.Query.Query, v.Name)
		}
		for _, before := range after {
			if !strings.Contains(v.Query.Query, before+`=~"$`+before+`"`) || !slices.Contains(d.varNames[:i], before) {
				t.Errorf("variable %s: query %q is not under $%s, defined before it", v.Name, v.Query.Query, before)
			}
		}
		if (v.Name == "namespace" || v.Name == "service" || v.Name == "outbox") && (!v.IncludeAll || v.AllValue != ".*") {
			t.Errorf("variable %s: includeAll %v, allValue %q; want All as .*", v.Name, v.IncludeAll, v.AllValue)
		}
	}
	for name := range chained {
		t.Errorf("no %s variable", name)
	}
}

// Every series a panel reads is chosen by the namespace, job and instance
// variables, and relayd's by outbox too (up has no outbox): no scrape job
// name is assumed, and one dashboard serves many outboxes.
func TestDashboardSelectsByJobAndInstance(t *testing.T) {
	d := loadDashboard(t)
	if regexp.MustCompile(`job\s*=\s*\\?"`).Match(d.raw) {
		t.Error(`the dashboard hard-codes a job (job="..."): select with job=~"$job"`)
	}
	for expr, p := range d.exprs() {
		for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
			want := []string{"namespace", "job", "service", "instance"}
			if m[1] != "up" {
				want = append(want, "outbox")
			}
			for _, l := range want {
				if !strings.Contains(m[2], l+`=~"$`+l+`"`) {
					t.Errorf("panel %q: %s%s is not selected by %s=~\"$%s\"", p.Title, m[1], m[2], l, l)
				}
			}
		}
	}
}

// A panel that aggregates relayd's series keeps deployments apart: each
// aggregation is by namespace, service and outbox (Kubernetes' deployments
// may all relay a table named outbox), whichever are selected.
func TestDashboardKeepsOutboxesApart(t *testing.T) {
	d := loadDashboard(t)
	agg := regexp.MustCompile(`\b(sum|max|min|avg|count|group|stddev|topk|bottomk)\s*(by\s*\(([^)]*)\))?\s*\(`)
	checked := 0
	for expr, p := range d.exprs() {
		if !strings.Contains(expr, "relayd_") {
			continue
		}
		for _, m := range agg.FindAllStringSubmatch(expr, -1) {
			checked++
			by := strings.Split(strings.ReplaceAll(m[3], " ", ""), ",")
			for _, l := range []string{"namespace", "service", "outbox"} {
				if !slices.Contains(by, l) {
					t.Errorf("panel %q: %s... in %s is not by %s: it mixes deployments", p.Title, m[0], expr, l)
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d aggregations found", checked)
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
