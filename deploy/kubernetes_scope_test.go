package deploy

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// One relayd deployment's queries select its own series: kubernetes/scope
// puts its namespace and its metrics Service's name (Prometheus Operator's
// "namespace" and "service" labels) in place of the placeholder below, in
// every selector of every alert and of KEDA's query. The PrometheusRule and
// the scope's replacements are generated from alerts.yml.

const (
	scopeFile = "kubernetes/scope/queries.yaml"
	unscoped  = "unscoped"
)

var scopeMatchers = `namespace="` + unscoped + `",service="` + unscoped + `"`

// scopeExpr adds the placeholder matchers to every selector of a relayd
// metric or of up in expr.
func scopeExpr(expr string) string {
	return metricRef.ReplaceAllStringFunc(expr, func(m string) string {
		name, sel, braced := strings.Cut(m, "{")
		sel = strings.TrimSuffix(sel, "}")
		if !braced || strings.TrimSpace(sel) == "" {
			return name + "{" + scopeMatchers + "}"
		}
		return name + "{" + sel + "," + scopeMatchers + "}"
	})
}

// scopeTo is expr as the scope leaves it for namespace ns and Service svc.
func scopeTo(expr, ns, svc string) string {
	r := strings.NewReplacer(`namespace="`+unscoped+`"`, `namespace="`+ns+`"`, `service="`+unscoped+`"`, `service="`+svc+`"`)
	return r.Replace(scopeExpr(expr))
}

// unscopedSelectors returns the selectors of expr that do not select
// namespace ns and Service svc alone.
func unscopedSelectors(expr, ns, svc string) []string {
	var bad []string
	for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
		if !strings.Contains(m[2], `namespace="`+ns+`"`) || !strings.Contains(m[2], `service="`+svc+`"`) {
			bad = append(bad, m[0])
		}
	}
	return bad
}

// placeholderIndices returns where the namespace and Service placeholders
// fall in expr split at '"': what a kustomize replacement with that
// delimiter addresses.
func placeholderIndices(expr string) (ns, svc []int) {
	parts := strings.Split(expr, `"`)
	for i := 1; i < len(parts); i++ {
		switch {
		case parts[i] != unscoped:
		case strings.HasSuffix(parts[i-1], "namespace="):
			ns = append(ns, i)
		case strings.HasSuffix(parts[i-1], "service="):
			svc = append(svc, i)
		}
	}
	return ns, svc
}

// ruleHeader opens the generated PrometheusRule; alerts.yml's groups follow,
// indented under spec, their selectors scoped.
const ruleHeader = `# Generated from deploy/alerts.yml, the rules' one source (promtool tests it),
# with ../../scope's placeholders in every selector: edit alerts.yml, then run
#   go test ./deploy -run 'TestKubernetes$' -update
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: relayd
  labels:
    app.kubernetes.io/name: relayd
    app.kubernetes.io/component: relay
spec:
`

var exprLine = regexp.MustCompile(`^(\s*)expr: (.*)$`)

// ruleFileContent is alerts.yml's groups, comments and all, as the
// PrometheusRule, every expression scoped (inline ones as block scalars).
func ruleFileContent(t *testing.T) []byte {
	data, _ := alertsGroups(t)
	i := bytes.Index(data, []byte("\ngroups:"))
	if i < 0 {
		t.Fatal("alerts.yml: no top-level groups:")
	}
	var out bytes.Buffer
	out.WriteString(ruleHeader)
	blockIndent := -1 // the indentation of the expr: key whose block we are in
	for line := range strings.SplitSeq(strings.TrimRight(string(data[i+1:]), "\n"), "\n") {
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if blockIndent >= 0 && (strings.TrimSpace(line) == "" || indent > blockIndent) {
			line = scopeExpr(line)
		} else {
			blockIndent = -1
		}
		if m := exprLine.FindStringSubmatch(line); m != nil {
			switch rest := m[2]; {
			case strings.HasPrefix(rest, "|") || strings.HasPrefix(rest, ">"):
				blockIndent = len(m[1])
			default:
				line = m[1] + "expr: |-\n" + m[1] + "  " + scopeExpr(rest)
			}
		}
		if line != "" {
			line = "  " + strings.ReplaceAll(line, "\n", "\n  ")
		}
		out.WriteString(line + "\n")
	}
	return out.Bytes()
}

// scopeFileContent is the scope's replacements of the placeholders, read off
// the generated rules and the ScaledObject's query.
func scopeFileContent(t *testing.T, rules []byte) []byte {
	var rule monitoringv1.PrometheusRule
	if err := yaml.UnmarshalStrict(rules, &rule); err != nil {
		t.Fatalf("the generated PrometheusRule: %v", err)
	}
	so := readScaledObject(t)
	// placeholder field -> kind -> index -> field paths
	paths := map[string]map[string]map[int][]string{"namespace": {}, "name": {}}
	addExpr := func(kind, path, expr string) {
		ns, svc := placeholderIndices(expr)
		for field, idx := range map[string][]int{"namespace": ns, "name": svc} {
			if paths[field][kind] == nil {
				paths[field][kind] = map[int][]string{}
			}
			for _, i := range idx {
				paths[field][kind][i] = append(paths[field][kind][i], path)
			}
		}
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			name := cmpOrString(r.Alert, r.Record)
			addExpr("PrometheusRule", fmt.Sprintf("spec.groups.[name=%s].rules.[%s=%s].expr", g.Name, ruleKey(r), name), r.Expr.String())
		}
	}
	for i, tr := range so.Spec.Triggers {
		addExpr("ScaledObject", fmt.Sprintf("spec.triggers.%d.metadata.query", i), tr.Metadata["query"])
	}
	var out strings.Builder
	out.WriteString(`# Generated by go test ./deploy -run 'TestKubernetes$' -update from the
# PrometheusRule and the ScaledObject: each target is a placeholder's place in
# an expression split at '"'.
apiVersion: builtin
kind: ReplacementTransformer
metadata:
  name: relayd-scope-queries
replacements:
`)
	for _, field := range []string{"namespace", "name"} {
		fmt.Fprintf(&out, "  - source:\n      kind: Service\n      name: relayd\n      fieldPath: metadata.%s\n    targets:\n", field)
		for _, kind := range slices.Sorted(maps.Keys(paths[field])) {
			for _, i := range slices.Sorted(maps.Keys(paths[field][kind])) {
				fmt.Fprintf(&out, "      - select:\n          kind: %s\n          name: relayd\n        fieldPaths:\n", kind)
				for _, p := range paths[field][kind][i] {
					fmt.Fprintf(&out, "          - %s\n", p)
				}
				fmt.Fprintf(&out, "        options:\n          delimiter: '\"'\n          index: %d\n", i)
			}
		}
	}
	return []byte(out.String())
}

func ruleKey(r monitoringv1.Rule) string {
	if r.Alert != "" {
		return "alert"
	}
	return "record"
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// readScaledObject reads the KEDA component's ScaledObject as written.
func readScaledObject(t *testing.T) *scaledObject {
	data, err := os.ReadFile(k8sDir + "/components/keda/scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var so scaledObject
	if err := yaml.UnmarshalStrict(data, &so); err != nil {
		t.Fatalf("scaledobject.yaml: %v", err)
	}
	return &so
}

// generated are the files the test writes with -update, and what they hold.
func generated(t *testing.T) map[string][]byte {
	rules := ruleFileContent(t)
	return map[string][]byte{ruleFile: rules, scopeFile: scopeFileContent(t, rules)}
}

func writeGenerated(t *testing.T) {
	for path, data := range generated(t) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	clear(built)
}

// The generated files are what alerts.yml and the ScaledObject make.
func TestKubernetesGeneratedFiles(t *testing.T) {
	for path, want := range generated(t) {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what alerts.yml and scaledobject.yaml make: run go test ./deploy -run 'TestKubernetes$' -update", path)
		}
	}
}

// scopeExpr puts the placeholders in every selector, braced or not, ranged
// or not, and placeholderIndices finds each.
func TestScopeExpr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`relayd_parked_messages > 0`, `relayd_parked_messages{` + scopeMatchers + `} > 0`},
		{`up{job="relayd"} == 0`, `up{job="relayd",` + scopeMatchers + `} == 0`},
		{`increase(relayd_late_confirms_total[10m])`, `increase(relayd_late_confirms_total{` + scopeMatchers + `}[10m])`},
		{`max by (namespace, service) (x{}) or absent(up{})`, `max by (namespace, service) (x{}) or absent(up{` + scopeMatchers + `})`},
		{`group_left(outbox) relayd_x{a="b",}`, `group_left(outbox) relayd_x{a="b",,` + scopeMatchers + `}`},
	} {
		if got := scopeExpr(tc.in); got != tc.want {
			t.Errorf("scopeExpr(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	ns, svc := placeholderIndices(scopeExpr(`relayd_a{job="relayd"} and on (x) relayd_b`))
	if !slices.Equal(ns, []int{3, 7}) || !slices.Equal(svc, []int{5, 9}) {
		t.Errorf("placeholder indices %v %v, want [3 7] [5 9]", ns, svc)
	}
}

// With the monitoring component, the PrometheusRule is alerts.yml's groups,
// rule for rule, every selector scoped to this deployment.
func checkRules(f *facts, b *bundle, p *problems) {
	if len(b.rules) == 0 && b.name == "base" {
		return
	}
	if len(b.rules) != 1 || len(b.services) != 1 {
		p.add("%d PrometheusRules and %d Services, want 1 and 1", len(b.rules), len(b.services))
		return
	}
	svc := b.services[0]
	want := make([]monitoringv1.RuleGroup, len(f.groups))
	for i, g := range f.groups {
		want[i] = g
		want[i].Rules = slices.Clone(g.Rules)
		for j := range want[i].Rules {
			want[i].Rules[j].Expr = intstr.FromString(scopeTo(g.Rules[j].Expr.String(), svc.Namespace, svc.Name))
		}
	}
	if got := b.rules[0].Spec.Groups; !reflect.DeepEqual(got, want) {
		p.add("the PrometheusRule's groups are not alerts.yml's scoped to %s/%s: run go test ./deploy -run 'TestKubernetes$' -update", svc.Namespace, svc.Name)
	}
}

// An overlay's alerts and KEDA's query select its own series only.
func checkScoped(_ *facts, b *bundle, p *problems) {
	if b.name == "base" {
		return
	}
	if len(b.services) != 1 {
		p.add("%d Services, want 1", len(b.services))
		return
	}
	svc := b.services[0]
	if svc.Namespace == "" {
		p.add("Service %s has no namespace: the scope needs the overlay's", svc.Name)
	}
	for _, r := range b.rules {
		for _, g := range r.Spec.Groups {
			for _, rule := range g.Rules {
				if bad := unscopedSelectors(rule.Expr.String(), svc.Namespace, svc.Name); len(bad) > 0 {
					p.add("%s's %s selects beyond %s/%s: %v", r.Name, rule.Alert, svc.Namespace, svc.Name, bad)
				}
			}
		}
	}
	for _, so := range b.scaled {
		for _, tr := range so.Spec.Triggers {
			if bad := unscopedSelectors(tr.Metadata["query"], svc.Namespace, svc.Name); len(bad) > 0 {
				p.add("ScaledObject %s's query selects beyond %s/%s: %v", so.Name, svc.Namespace, svc.Name, bad)
			}
		}
	}
}

// estateChecks are run on a whole build, whatever number of relayd
// deployments it holds.
var estateChecks = map[string]func(*facts, *bundle, *problems){
	"names":     checkNamesUnique,
	"selectors": checkSelectorsOwnOnly,
	"dashboard": checkDashboardOnce,
	"labelled":  checkLabelled,
}

// In an overlay every object but the Namespace and the estate's dashboard is
// one relayd deployment's: it carries the instance label, the name of that
// deployment's Deployment.
func checkLabelled(_ *facts, b *bundle, p *problems) {
	if b.name == "base" {
		return
	}
	deployments := map[string]bool{}
	for _, d := range b.deployments {
		deployments[d.Name] = true
	}
	for _, o := range b.objects {
		if o.kind == "Namespace" || o.meta.GetLabels()["grafana_dashboard"] == "1" {
			continue
		}
		if got := o.meta.GetLabels()[instanceLabel]; !deployments[got] {
			p.add("%s %s: %s=%q, not the name of a relay Deployment", o.kind, o.meta.GetName(), instanceLabel, got)
		}
	}
}

// An overlay has the dashboard once, as the file is, labelled for Grafana's
// sidecar: one per estate, whatever number of deployments.
func checkDashboardOnce(_ *facts, b *bundle, p *problems) {
	if b.name == "base" {
		return
	}
	want, err := os.ReadFile(dashboardFile)
	if err != nil {
		p.add("%v", err)
		return
	}
	var found []string
	for name, cm := range b.configMaps {
		if cm.Labels["grafana_dashboard"] != "1" {
			continue
		}
		found = append(found, name)
		if got := cm.Data[filepath.Base(dashboardFile)]; got != string(want) {
			p.add("ConfigMap %s does not hold %s as it is", name, dashboardFile)
		}
	}
	if len(found) != 1 {
		p.add("%d dashboard ConfigMaps %v, want 1", len(found), found)
	}
}

// No two objects of one kind share a name in a namespace: the second apply
// would overwrite the first.
func checkNamesUnique(_ *facts, b *bundle, p *problems) {
	seen := map[string]bool{}
	for _, o := range b.objects {
		id := o.kind + " " + o.meta.GetNamespace() + "/" + o.meta.GetName()
		if seen[id] {
			p.add("two objects are %s", id)
		}
		seen[id] = true
	}
}

// podTemplate is a pod template of the build with the instance it belongs to.
type podTemplate struct {
	owner    string
	instance string
	labels   map[string]string
}

// Every selector selects pods (or Services) of its own relayd deployment
// only, and at least one: the Deployments', Services', PDBs',
// ServiceMonitors', NetworkPolicies' and spread constraints'.
func checkSelectorsOwnOnly(_ *facts, b *bundle, p *problems) {
	var pods []podTemplate
	for _, d := range b.deployments {
		pods = append(pods, podTemplate{"Deployment " + d.Name, d.Labels[instanceLabel], d.Spec.Template.Labels})
	}
	for _, j := range b.jobs {
		pods = append(pods, podTemplate{"Job " + j.Name, j.Labels[instanceLabel], j.Spec.Template.Labels})
	}
	var services []podTemplate
	for _, s := range b.services {
		services = append(services, podTemplate{"Service " + s.Name, s.Labels[instanceLabel], s.Labels})
	}
	type selector struct {
		owner    string
		instance string
		sel      *metav1.LabelSelector
		of       []podTemplate
	}
	var sels []selector
	for _, d := range b.deployments {
		sels = append(sels, selector{"Deployment " + d.Name, d.Labels[instanceLabel], d.Spec.Selector, pods})
		for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
			sels = append(sels, selector{"Deployment " + d.Name + "'s spread", d.Labels[instanceLabel], tsc.LabelSelector, pods})
		}
	}
	for _, s := range b.services {
		sels = append(sels, selector{"Service " + s.Name, s.Labels[instanceLabel], &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, pods})
	}
	for _, pdb := range b.pdbs {
		sels = append(sels, selector{"PodDisruptionBudget " + pdb.Name, pdb.Labels[instanceLabel], pdb.Spec.Selector, pods})
	}
	for _, np := range b.netpols {
		sels = append(sels, selector{"NetworkPolicy " + np.Name, np.Labels[instanceLabel], &np.Spec.PodSelector, pods})
		for _, in := range np.Spec.Ingress {
			for _, peer := range in.From {
				if peer.PodSelector != nil && peer.NamespaceSelector == nil {
					sels = append(sels, selector{"NetworkPolicy " + np.Name + "'s ingress", np.Labels[instanceLabel], peer.PodSelector, pods})
				}
			}
		}
		for _, out := range np.Spec.Egress {
			for _, peer := range out.To {
				sels = append(sels, selector{"NetworkPolicy " + np.Name + "'s egress", np.Labels[instanceLabel], peer.PodSelector, pods})
			}
		}
	}
	for _, sm := range b.svcMonitors {
		sels = append(sels, selector{"ServiceMonitor " + sm.Name, sm.Labels[instanceLabel], &sm.Spec.Selector, services})
	}
	for _, s := range sels {
		if s.sel == nil || len(s.sel.MatchExpressions) > 0 {
			p.add("%s: want a matchLabels selector", s.owner)
			continue
		}
		n := 0
		for _, pod := range s.of {
			if !selects(s.sel.MatchLabels, pod.labels) {
				continue
			}
			n++
			if pod.instance != s.instance {
				p.add("%s (of %q) selects %s (of %q)", s.owner, s.instance, pod.owner, pod.instance)
			}
		}
		if n == 0 {
			p.add("%s selects nothing", s.owner)
		}
	}
}

// The rules an estate's overlay renders fire for their own deployment only:
// promtool runs orders' rules over orders' and payments' series, both
// lagging, payments up and orders' targets gone.
func TestRenderedRulesFireForTheirOwnDeployment(t *testing.T) {
	bin := promtool(t)
	var rule *monitoringv1.PrometheusRule
	for _, r := range kustomize(t, "overlays/estate").rules {
		if r.Name == "orders-relayd" {
			rule = r
		}
	}
	if rule == nil {
		t.Fatal("overlays/estate has no PrometheusRule orders-relayd")
	}
	groups := slices.Clone(rule.Spec.Groups)
	for i := range groups {
		groups[i].Rules = slices.Clone(groups[i].Rules)
		for j := range groups[i].Rules {
			groups[i].Rules[j].Annotations = nil // the test is of what fires, not its text
		}
	}
	series := func(name, svc, outbox, extra, values string) map[string]string {
		return map[string]string{"series": fmt.Sprintf(`%s{job="relayd",namespace="shop",service=%q,outbox=%q,instance=%q%s}`, name, svc, outbox, svc+"-0", extra), "values": values}
	}
	var input []map[string]string
	for _, d := range []struct{ svc, outbox string }{{"orders-relayd", "outbox"}, {"payments-relayd", "payments_outbox"}} {
		input = append(input,
			series("relayd_outbox_lag_seconds", d.svc, d.outbox, `,target="nats"`, "300x40"),
			series("relayd_outbox_stats_timestamp_seconds", d.svc, d.outbox, "", "0+15x40"))
	}
	input = append(input, map[string]string{"series": `up{job="relayd",namespace="shop",service="payments-relayd",instance="payments-relayd-0"}`, "values": "1x40"})
	orders := map[string]string{"job": "relayd", "namespace": "shop", "service": "orders-relayd"}
	lagging := maps.Clone(orders)
	maps.Copy(lagging, map[string]string{"outbox": "outbox", "target": "nats", "severity": "page"})
	down := maps.Clone(orders)
	down["severity"] = "page"
	test := map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "15s",
		"tests": []any{map[string]any{
			"interval":     "15s",
			"input_series": input,
			"alert_rule_test": []any{
				map[string]any{"eval_time": "10m", "alertname": "RelaydOutboxLagHigh", "exp_alerts": []any{map[string]any{"exp_labels": lagging}}},
				map[string]any{"eval_time": "10m", "alertname": "RelaydDown", "exp_alerts": []any{map[string]any{"exp_labels": down}}},
				map[string]any{"eval_time": "10m", "alertname": "RelaydStatsStaleEverywhere"},
			},
		}},
	}
	dir := t.TempDir()
	for name, v := range map[string]any{"rules.yml": map[string]any{"groups": groups}, "test.yml": test} {
		data, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "test", "rules", "test.yml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules on orders' rendered rules: %v\n%s", err, out)
	}
}
