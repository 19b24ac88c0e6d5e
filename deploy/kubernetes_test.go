package deploy

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/relayd/relayd/internal/testenv"
)

// The Kubernetes manifests in kubernetes/ are built with kustomize in
// process and every object decoded strictly into its Go type, then checked
// against what relayd reads, serves and measured.

var update = flag.Bool("update", false, "rewrite kubernetes/components/monitoring/prometheusrule.yaml from alerts.yml")

const (
	k8sDir   = "kubernetes"
	ruleFile = "kubernetes/components/monitoring/prometheusrule.yaml"
	// allSuffix names the test's own copy of an overlay with every
	// commented-out component line uncommented, as their comments invite.
	allSuffix  = "-all"
	allOverlay = "overlays/example" + allSuffix
)

// commentedComponent is an overlay's line listing a component, commented out.
var commentedComponent = regexp.MustCompile(`(?m)^(\s*)# (- (\.\./)+components/)`)

// scaledObject is the part of KEDA's ScaledObject (keda.sh/v1alpha1) the
// manifests use. KEDA's own module (github.com/kedacore/keda/v2) brings in
// much of Kubernetes' controller machinery for one type: a field outside
// these fails the strict decode, so add it here when the manifest needs it.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		Triggers        []struct {
			Type       string            `json:"type"`
			MetricType string            `json:"metricType,omitempty"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// stream is the part of nack's Stream (jetstream.nats.io/v1beta2) the
// stream component uses; the strict decode refuses any other field.
type stream struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Name            string   `json:"name"`
		Subjects        []string `json:"subjects"`
		Storage         string   `json:"storage"`
		Replicas        int      `json:"replicas"`
		DuplicateWindow string   `json:"duplicateWindow"`
	} `json:"spec"`
}

// kinds maps each kind the manifests may hold to its apiVersion and a new
// value of its Go type. Any other kind fails the build check.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Namespace":           {"v1", func() any { return &corev1.Namespace{} }},
	"ServiceAccount":      {"v1", func() any { return &corev1.ServiceAccount{} }},
	"NetworkPolicy":       {"networking.k8s.io/v1", func() any { return &networkingv1.NetworkPolicy{} }},
	"ConfigMap":           {"v1", func() any { return &corev1.ConfigMap{} }},
	"Secret":              {"v1", func() any { return &corev1.Secret{} }},
	"Service":             {"v1", func() any { return &corev1.Service{} }},
	"Deployment":          {"apps/v1", func() any { return &appsv1.Deployment{} }},
	"Job":                 {"batch/v1", func() any { return &batchv1.Job{} }},
	"PodDisruptionBudget": {"policy/v1", func() any { return &policyv1.PodDisruptionBudget{} }},
	"ServiceMonitor":      {"monitoring.coreos.com/v1", func() any { return &monitoringv1.ServiceMonitor{} }},
	"PodMonitor":          {"monitoring.coreos.com/v1", func() any { return &monitoringv1.PodMonitor{} }},
	"PrometheusRule":      {"monitoring.coreos.com/v1", func() any { return &monitoringv1.PrometheusRule{} }},
	"ScaledObject":        {"keda.sh/v1alpha1", func() any { return &scaledObject{} }},
	"Stream":              {"jetstream.nats.io/v1beta2", func() any { return &stream{} }},
}

// bundle is one kustomize build, decoded, or the part of one that is one
// relayd deployment (split).
type bundle struct {
	name        string
	objects     []object
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	services    []*corev1.Service
	deployments []*appsv1.Deployment
	jobs        []*batchv1.Job
	pdbs        []*policyv1.PodDisruptionBudget
	svcMonitors []*monitoringv1.ServiceMonitor
	rules       []*monitoringv1.PrometheusRule
	scaled      []*scaledObject
	accounts    []*corev1.ServiceAccount
	netpols     []*networkingv1.NetworkPolicy
	streams     []*stream
	raw         []byte
}

// object is one decoded object with its identity.
type object struct {
	kind string
	meta metav1.Object
	obj  any
}

// built caches each root's build: a check may mutate its own decode.
var built = map[string][]byte{}

// kustomize builds dir (relative to kubernetes/) from an in-memory copy of
// kubernetes/ with the test's overlay added, and decodes every object
// strictly, afresh at each call.
func kustomize(t *testing.T, dir string) *bundle {
	t.Helper()
	raw, ok := built[dir]
	if !ok {
		var err error
		if raw, err = buildYAML(dir); err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		built[dir] = raw
	}
	b, err := decode(dir, raw)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return b
}

func buildYAML(dir string) ([]byte, error) {
	fsys := filesys.MakeFsInMemory()
	all, isAll := strings.CutSuffix(dir, allSuffix)
	uncommented := 0
	err := filepath.WalkDir(k8sDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		path = filepath.ToSlash(path)
		if rest, ok := strings.CutPrefix(path, k8sDir+"/"+all+"/"); ok && isAll {
			uncommented += len(commentedComponent.FindAll(data, -1))
			copied := commentedComponent.ReplaceAll(data, []byte("$1$2"))
			if err := fsys.WriteFile("/"+k8sDir+"/"+dir+"/"+rest, copied); err != nil {
				return err
			}
		}
		return fsys.WriteFile("/"+path, data)
	})
	if err != nil {
		return nil, err
	}
	if isAll && uncommented == 0 {
		return nil, fmt.Errorf("%s: no commented-out component line to uncomment", all)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, "/"+k8sDir+"/"+dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}

func decode(name string, raw []byte) (*bundle, error) {
	b := newBundle(name, raw)
	for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("object %d: %v", i, err)
		}
		k, ok := kinds[tm.Kind]
		if !ok {
			return nil, fmt.Errorf("object %d: kind %q is not one the test knows", i, tm.Kind)
		}
		if tm.APIVersion != k.apiVersion {
			return nil, fmt.Errorf("%s: apiVersion %q, want %q", tm.Kind, tm.APIVersion, k.apiVersion)
		}
		obj := k.new()
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("%s: strict decode: %v", tm.Kind, err)
		}
		b.add(tm.Kind, obj)
	}
	return b, nil
}

func newBundle(name string, raw []byte) *bundle {
	return &bundle{name: name, raw: raw, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
}

func (b *bundle) add(kind string, obj any) {
	b.objects = append(b.objects, object{kind, obj.(metav1.Object), obj})
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		b.configMaps[o.Name] = o
	case *corev1.Secret:
		b.secrets[o.Name] = o
	case *corev1.Service:
		b.services = append(b.services, o)
	case *appsv1.Deployment:
		b.deployments = append(b.deployments, o)
	case *batchv1.Job:
		b.jobs = append(b.jobs, o)
	case *policyv1.PodDisruptionBudget:
		b.pdbs = append(b.pdbs, o)
	case *monitoringv1.ServiceMonitor:
		b.svcMonitors = append(b.svcMonitors, o)
	case *monitoringv1.PrometheusRule:
		b.rules = append(b.rules, o)
	case *scaledObject:
		b.scaled = append(b.scaled, o)
	case *corev1.ServiceAccount:
		b.accounts = append(b.accounts, o)
	case *networkingv1.NetworkPolicy:
		b.netpols = append(b.netpols, o)
	case *stream:
		b.streams = append(b.streams, o)
	}
}

// instanceLabel tells one relayd deployment's objects from another's
// (../scope).
const instanceLabel = "app.kubernetes.io/instance"

// split returns one bundle per relayd deployment: the objects labelled with
// its instance. A build with no such label (the base) is one deployment.
func (b *bundle) split() []*bundle {
	var names []string
	for _, o := range b.objects {
		if v, ok := o.meta.GetLabels()[instanceLabel]; ok && !slices.Contains(names, v) {
			names = append(names, v)
		}
	}
	if len(names) == 0 {
		return []*bundle{b}
	}
	var out []*bundle
	for _, name := range names {
		sub := newBundle(b.name+"/"+name, b.raw)
		for _, o := range b.objects {
			if o.meta.GetLabels()[instanceLabel] == name {
				sub.add(o.kind, o.obj)
			}
		}
		out = append(out, sub)
	}
	return out
}

// pod is one pod template of the bundle, named for its owner.
type pod struct {
	owner  string
	labels map[string]string
	spec   *corev1.PodSpec
}

func (b *bundle) pods() []pod {
	var out []pod
	for _, d := range b.deployments {
		out = append(out, pod{"Deployment " + d.Name, d.Spec.Template.Labels, &d.Spec.Template.Spec})
	}
	for _, j := range b.jobs {
		out = append(out, pod{"Job " + j.Name, j.Spec.Template.Labels, &j.Spec.Template.Spec})
	}
	return out
}

// relay returns the relay Deployment and its relayd container, or nil and
// nil with a problem added when there is not exactly one.
func (b *bundle) relay(p *problems) (*appsv1.Deployment, *corev1.Container) {
	if len(b.deployments) != 1 {
		p.add("%d Deployments, want the one relayd", len(b.deployments))
		return nil, nil
	}
	d := b.deployments[0]
	for i, c := range d.Spec.Template.Spec.Containers {
		if slices.Equal(c.Args, []string{"run"}) {
			return d, &d.Spec.Template.Spec.Containers[i]
		}
	}
	p.add("Deployment %s has no container running `relayd run`", d.Name)
	return nil, nil
}

// env returns what relayd in container c reads: its defaults (from the env
// tags), then the ConfigMaps of envFrom, then env's own values. Values from
// Secrets are "(secret)".
func (b *bundle) env(c *corev1.Container, defaults map[string]string) map[string]string {
	out := maps.Clone(defaults)
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef != nil {
			if cm := b.configMaps[from.ConfigMapRef.Name]; cm != nil {
				for k, v := range cm.Data {
					out[from.Prefix+k] = v
				}
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			out[e.Name] = "(secret)"
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			if cm := b.configMaps[e.ValueFrom.ConfigMapKeyRef.Name]; cm != nil {
				out[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			}
		default:
			out[e.Name] = e.Value
		}
	}
	return out
}

// relaydEnv returns every variable cmd/relayd reads through go-envconfig
// tags (package main: read from source), with its default.
func relaydEnv(t *testing.T) map[string]string {
	t.Helper()
	vars := map[string]string{}
	for _, f := range relaydSources(t) {
		ast.Inspect(f, func(n ast.Node) bool {
			if field, ok := n.(*ast.Field); ok {
				if name, _, def, ok := testenv.EnvTag(field); ok {
					vars[name] = def
				}
			}
			return true
		})
	}
	if _, ok := vars["RELAY_DATABASE_URL"]; !ok || len(vars) < 20 {
		t.Fatalf("read %d env tags from cmd/relayd: the source scan is broken", len(vars))
	}
	return vars
}

// servedPaths returns the paths cmd/relayd registers on an HTTP mux.
func servedPaths(t *testing.T) map[string]bool {
	t.Helper()
	paths := map[string]bool{}
	for _, f := range relaydSources(t) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Handle" || sel.Sel.Name == "HandleFunc") {
				if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					p, _ := strconv.Unquote(lit.Value)
					paths[p] = true
				}
			}
			return true
		})
	}
	if !paths["/metrics"] {
		t.Fatalf("found no /metrics handler in cmd/relayd (found %v): the source scan is broken", paths)
	}
	return paths
}

func relaydSources(t *testing.T) []*ast.File {
	t.Helper()
	files, err := filepath.Glob("../cmd/relayd/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in cmd/relayd: %v", err)
	}
	var out []*ast.File
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// envNotTagged are variables relayd reads that are not RELAY_* tags: Go's
// own, documented in docs/configuration.md.
var envNotTagged = []string{"GOMAXPROCS"}

// builds are the kustomize roots checked: the base alone, the example
// overlay (one relayd) and the estate (two in one namespace), each also with
// every component.
var builds = []string{"base", "overlays/example", allOverlay, "overlays/estate", "overlays/estate" + allSuffix}

// problems collects what one check finds wrong in one build.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// facts are what the manifests are checked against, read from relayd's
// source, its docs and alerts.yml.
type facts struct {
	defaults map[string]string // relayd's variables and their defaults
	known    map[string]bool   // every variable relayd reads
	served   map[string]bool   // the paths its HTTP server serves
	peakRSS  resource.Quantity // the largest the bench measured
	job      string            // the scrape job RelaydDown reads
	groups   []monitoringv1.RuleGroup
	exported map[string]string // metric name → type
}

func readFacts(t *testing.T) *facts {
	t.Helper()
	f := &facts{defaults: relaydEnv(t), known: map[string]bool{}, served: servedPaths(t), peakRSS: peakRSS(t), exported: exportedMetrics(t)}
	for name := range f.defaults {
		f.known[name] = true
	}
	for _, name := range envNotTagged {
		f.known[name] = true
	}
	var alerts []byte
	alerts, f.groups = alertsGroups(t)
	m := regexp.MustCompile(`up\{job="([^"]+)"\}`).FindSubmatch(alerts)
	if m == nil {
		t.Fatal(`alerts.yml: no up{job="..."}`)
	}
	f.job = string(m[1])
	return f
}

// checks are run on every build; TestKubernetesChecksCatchBreakage breaks
// each and sees it fail.
var checks = map[string]func(*facts, *bundle, *problems){
	"probes":    checkProbes,
	"env":       checkEnvNames,
	"times":     checkShutdownAndStartup,
	"security":  checkRestricted,
	"resources": checkResources,
	"secrets":   checkSecrets,
	"rules":     checkRules,
	"service":   checkServiceAndMonitor,
	"replicas":  checkReplicasAndKEDA,
	"migrate":   checkMigratesFirst,
	"scope":     checkScoped,
	"network":   checkNetworkPolicy,
	"account":   checkServiceAccount,
	"stream":    checkStream,
}

func TestKubernetes(t *testing.T) {
	if *update {
		writeGenerated(t)
	}
	f := readFacts(t)
	for _, dir := range builds {
		t.Run(dir, func(t *testing.T) {
			whole := kustomize(t, dir) // builds and decodes, or fails once
			for _, name := range slices.Sorted(maps.Keys(estateChecks)) {
				t.Run(name, func(t *testing.T) {
					var p problems
					estateChecks[name](f, kustomize(t, dir), &p)
					for _, msg := range p {
						t.Error(msg)
					}
				})
			}
			for i, one := range whole.split() {
				t.Run(strings.TrimPrefix(one.name, dir+"/"), func(t *testing.T) {
					for _, name := range slices.Sorted(maps.Keys(checks)) {
						t.Run(name, func(t *testing.T) {
							var p problems
							checks[name](f, kustomize(t, dir).split()[i], &p)
							for _, msg := range p {
								t.Error(msg)
							}
						})
					}
				})
			}
		})
	}
}

// The strict decode refuses a field its type lacks.
func TestKubernetesDecodeIsStrict(t *testing.T) {
	for kind, doc := range map[string]string{
		"Deployment":   "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n",
		"ScaledObject": "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata:\n  name: x\nspec:\n  minReplicas: 2\n",
		"apiVersion":   "apiVersion: apps/v1beta1\nkind: Deployment\nmetadata:\n  name: x\n",
	} {
		if _, err := decode(kind, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error: %s", kind, doc)
		}
	}
}

// The relay's probes are the paths relayd serves, on the port relayd
// listens on: /healthz for liveness and start-up, /readyz for readiness
// (never for liveness: a broker outage fails it everywhere).
func checkProbes(f *facts, b *bundle, p *problems) {
	_, c := b.relay(p)
	if c == nil {
		return
	}
	addr := b.env(c, f.defaults)["RELAY_METRICS_ADDR"]
	host, port, err := net.SplitHostPort(addr)
	if err != nil || (host != "" && host != "0.0.0.0" && host != "::") {
		p.add("RELAY_METRICS_ADDR=%q: want every interface, \":PORT\": the kubelet cannot reach loopback", addr)
	}
	for _, probe := range []struct {
		kind, path string
		probe      *corev1.Probe
	}{{"liveness", "/healthz", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}, {"startup", "/healthz", c.StartupProbe}} {
		if probe.probe == nil || probe.probe.HTTPGet == nil {
			p.add("no httpGet %s probe", probe.kind)
			continue
		}
		get := probe.probe.HTTPGet
		if get.Path != probe.path || !f.served[get.Path] {
			p.add("%s probe on %q, want %s (relayd serves %v)", probe.kind, get.Path, probe.path, slices.Sorted(maps.Keys(f.served)))
		}
		if got := containerPort(c, get.Port); strconv.Itoa(int(got)) != port {
			p.add("%s probe on port %s (%d), but relayd listens on %q", probe.kind, get.Port.String(), got, addr)
		}
	}
}

// containerPort resolves a probe's or Service's port, named or numbered.
func containerPort(c *corev1.Container, port intstr.IntOrString) int32 {
	if port.Type == intstr.Int {
		return port.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// containers returns every container of every pod template, with where it is.
func (b *bundle) containers() (out []struct {
	where string
	pod   *corev1.PodSpec
	c     *corev1.Container
}) {
	for _, pd := range b.pods() {
		for _, list := range [][]corev1.Container{pd.spec.InitContainers, pd.spec.Containers} {
			for i := range list {
				out = append(out, struct {
					where string
					pod   *corev1.PodSpec
					c     *corev1.Container
				}{pd.owner + " container " + list[i].Name, pd.spec, &list[i]})
			}
		}
	}
	return out
}

// Every variable a container is given is one relayd reads: a misspelt
// RELAY_* would be ignored silently.
func checkEnvNames(f *facts, b *bundle, p *problems) {
	checked := 0
	for _, x := range b.containers() {
		var names []string
		for _, e := range x.c.Env {
			names = append(names, e.Name)
		}
		for _, from := range x.c.EnvFrom {
			if from.SecretRef != nil {
				p.add("%s: envFrom a Secret: name each variable with a secretKeyRef", x.where)
			}
			if from.ConfigMapRef == nil {
				continue
			}
			cm := b.configMaps[from.ConfigMapRef.Name]
			if cm == nil {
				p.add("%s: envFrom ConfigMap %s, which is not in the build", x.where, from.ConfigMapRef.Name)
				continue
			}
			for key := range cm.Data {
				names = append(names, from.Prefix+key)
			}
		}
		for _, name := range names {
			checked++
			if !f.known[name] {
				p.add("%s sets %s, which relayd does not read", x.where, name)
			}
		}
	}
	if checked < 5 {
		p.add("only %d variables found", checked)
	}
}

// The kubelet waits longer than relayd lets in-flight batches finish
// (RELAY_PUBLISH_TIMEOUT < RELAY_SHUTDOWN_TIMEOUT < the grace period,
// docs/deploying.md), and the start-up probe longer than relayd waits for
// Postgres, NATS and RabbitMQ one after the other.
func checkShutdownAndStartup(f *facts, b *bundle, p *problems) {
	d, c := b.relay(p)
	if c == nil {
		return
	}
	env := b.env(c, f.defaults)
	durations := map[string]time.Duration{}
	for _, name := range []string{"RELAY_SHUTDOWN_TIMEOUT", "RELAY_PUBLISH_TIMEOUT", "RELAY_STARTUP_TIMEOUT"} {
		v, err := time.ParseDuration(env[name])
		if err != nil {
			p.add("%s=%q: %v", name, env[name], err)
			return
		}
		durations[name] = v
	}
	shutdown := durations["RELAY_SHUTDOWN_TIMEOUT"]
	grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= shutdown {
		p.add("terminationGracePeriodSeconds %s, want more than RELAY_SHUTDOWN_TIMEOUT %v", ptrString(grace), shutdown)
	}
	if publish := durations["RELAY_PUBLISH_TIMEOUT"]; publish >= shutdown {
		p.add("RELAY_PUBLISH_TIMEOUT %v, want less than RELAY_SHUTDOWN_TIMEOUT %v", publish, shutdown)
	}
	startup := 3 * durations["RELAY_STARTUP_TIMEOUT"]
	if sp := c.StartupProbe; sp == nil {
		p.add("no startup probe: relayd serves /healthz only once connected (up to %v)", startup)
	} else if budget := time.Duration(sp.InitialDelaySeconds+sp.PeriodSeconds*sp.FailureThreshold) * time.Second; budget < startup {
		p.add("the startup probe gives up after %v, before relayd's own start-up waits end (%v)", budget, startup)
	}
}

func ptrString[T any](v *T) string {
	if v == nil {
		return "unset"
	}
	return fmt.Sprint(*v)
}

// cmpOr is the container's setting if set, else the pod's.
func cmpOr[T any](c, pod *T) *T {
	if c != nil {
		return c
	}
	return pod
}

// Every container of every pod runs as a numeric non-root uid (the image's
// USER is a name, which the kubelet cannot check), on a read-only root
// filesystem, with no capabilities and no privilege escalation.
func checkRestricted(_ *facts, b *bundle, p *problems) {
	for _, x := range b.containers() {
		psc := cmpOr(x.pod.SecurityContext, &corev1.PodSecurityContext{})
		sc := cmpOr(x.c.SecurityContext, &corev1.SecurityContext{})
		if nonRoot := cmpOr(sc.RunAsNonRoot, psc.RunAsNonRoot); nonRoot == nil || !*nonRoot {
			p.add("%s: runAsNonRoot is not true", x.where)
		}
		if uid := cmpOr(sc.RunAsUser, psc.RunAsUser); uid == nil || *uid == 0 {
			p.add("%s: runAsUser %s, want a numeric non-root uid", x.where, ptrString(uid))
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			p.add("%s: readOnlyRootFilesystem is not true", x.where)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			p.add("%s: allowPrivilegeEscalation is not false", x.where)
		}
		if sc.Privileged != nil && *sc.Privileged {
			p.add("%s: privileged", x.where)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			p.add("%s: capabilities %+v, want drop ALL and add none", x.where, sc.Capabilities)
		}
	}
}

// peakRSS returns the largest figure of docs/performance.md's peak RSS
// columns.
func peakRSS(t *testing.T) resource.Quantity {
	t.Helper()
	data, err := os.ReadFile("../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	var peak int64
	col := -1
	for line := range strings.SplitSeq(string(data), "\n") {
		if !strings.HasPrefix(line, "|") {
			col = -1
			continue
		}
		cells := strings.Split(line, "|")
		if i := slices.IndexFunc(cells, func(c string) bool { return strings.TrimSpace(c) == "peak RSS" }); i >= 0 {
			col = i
			continue
		}
		if col < 0 || col >= len(cells) {
			continue
		}
		if mib, ok := strings.CutSuffix(strings.TrimSpace(cells[col]), " MiB"); ok {
			n, err := strconv.ParseInt(mib, 10, 64)
			if err != nil {
				t.Fatalf("performance.md: peak RSS %q", cells[col])
			}
			peak = max(peak, n)
		}
	}
	if peak == 0 {
		t.Fatal("found no peak RSS column in docs/performance.md")
	}
	return *resource.NewQuantity(peak<<20, resource.BinarySI)
}

// Every container asks for CPU and for at least the largest peak RSS the
// bench measured, and is limited above that.
func checkResources(f *facts, b *bundle, p *problems) {
	for _, x := range b.containers() {
		req, lim := x.c.Resources.Requests.Memory(), x.c.Resources.Limits.Memory()
		if req.Cmp(f.peakRSS) < 0 {
			p.add("%s: memory request %v, below the bench's peak RSS %v", x.where, req, &f.peakRSS)
		}
		if lim.IsZero() || lim.Cmp(*req) <= 0 {
			p.add("%s: memory limit %v, want one above the request %v", x.where, lim, req)
		}
		if x.c.Resources.Requests.Cpu().IsZero() {
			p.add("%s: no CPU request", x.where)
		}
	}
}

// urlVars are the settings that name a server, and may name a user; never
// a password.
var urlVars = []string{"RELAY_DATABASE_URL", "RELAY_AMQP_URL", "RELAY_NATS_URL"}

var userinfo = regexp.MustCompile(`[a-z]+://[^/@\s:"]+:[^/@\s"]+@`)

// fileVar matches the settings that name a file relayd reads a secret from.
var fileVar = regexp.MustCompile(`^RELAY_[A-Z_]+_(FILE|CA|CERT|KEY|CREDS|NKEY)$`)

// externalSecrets are Secrets a pod mounts that something other than the
// overlay makes: cert-manager, the TLS component's.
var externalSecrets = []string{"relayd-tls"}

// secretFiles returns every file a container's settings name for relayd to
// read: the file settings, and the files of Postgres's URL.
func secretFiles(env map[string]string) map[string]string {
	files := map[string]string{}
	for k, v := range env {
		if fileVar.MatchString(k) && v != "" {
			files[k] = v
		}
	}
	if u, err := url.Parse(env["RELAY_DATABASE_URL"]); err == nil {
		for _, param := range []string{"sslrootcert", "sslcert", "sslkey"} {
			if v := u.Query().Get(param); v != "" {
				files["RELAY_DATABASE_URL's "+param] = v
			}
		}
	}
	return files
}

// The base ships no credentials. No password is in a URL, or in the
// environment: every secret relayd reads is a file of a Secret mounted
// read-only, and in an overlay the Secret is in the build with that key and
// a placeholder value.
func checkSecrets(f *facts, b *bundle, p *problems) {
	base := b.name == "base"
	if base && len(b.secrets) > 0 {
		p.add("the base ships Secrets %v", slices.Sorted(maps.Keys(b.secrets)))
	}
	if userinfo.Match(b.raw) {
		p.add("a URL with a password: %s", userinfo.Find(b.raw))
	}
	for _, x := range b.containers() {
		for _, e := range x.c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				p.add("%s: %s from a Secret into the environment: mount it as a file", x.where, e.Name)
			}
		}
		env := b.env(x.c, f.defaults)
		for _, k := range urlVars {
			// Only what the build sets: relayd's default AMQP URL is guest's.
			if env[k] == f.defaults[k] {
				continue
			}
			if userinfo.MatchString(env[k]) {
				p.add("%s: %s holds a password", x.where, k)
			}
		}
		for setting, path := range secretFiles(env) {
			checkSecretFile(b, x.where, x.pod, x.c, setting, path, p)
		}
	}
	for _, s := range b.secrets {
		for k, v := range s.Data {
			if !bytes.Contains(v, []byte("REPLACE-ME")) {
				p.add("Secret %s key %s is not a REPLACE-ME placeholder", s.Name, k)
			}
		}
	}
}

// checkSecretFile checks that path, named by setting, is a key of a Secret
// mounted read-only in container c.
func checkSecretFile(b *bundle, where string, pod *corev1.PodSpec, c *corev1.Container, setting, path string, p *problems) {
	for _, m := range c.VolumeMounts {
		key, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		if !m.ReadOnly {
			p.add("%s: volume %s is mounted writable", where, m.Name)
		}
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || pod.Volumes[i].Secret == nil {
			p.add("%s: %s=%s is on volume %s, not a Secret", where, setting, path, m.Name)
			return
		}
		name := pod.Volumes[i].Secret.SecretName
		s := b.secrets[name]
		switch {
		case s == nil && b.name != "base" && !slices.ContainsFunc(externalSecrets, func(e string) bool { return strings.HasSuffix(name, e) }):
			p.add("%s: %s=%s is of Secret %s, which is not in the build", where, setting, path, name)
		case s != nil && s.Data[key] == nil && s.StringData[key] == "":
			p.add("%s: %s=%s, but Secret %s has no key %s", where, setting, path, name, key)
		}
		return
	}
	p.add("%s: %s=%s is on no volume mounted in the container", where, setting, path)
}

// alertsGroups reads alerts.yml strictly as the Prometheus Operator's rule
// groups.
func alertsGroups(t *testing.T) ([]byte, []monitoringv1.RuleGroup) {
	t.Helper()
	data, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(data, &rules); err != nil {
		t.Fatalf("alerts.yml as PrometheusRule groups: %v", err)
	}
	if len(rules.Groups) == 0 {
		t.Fatal("alerts.yml: no groups")
	}
	return data, rules.Groups
}

// selects reports whether a non-empty label selector matches labels.
func selects(sel map[string]string, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// The Service and the PodDisruptionBudget select the relay's pods and not
// the backfill's; the Service targets the metrics port and publishes pods
// that are not ready (they are scraped through an outage). The
// ServiceMonitor scrapes /metrics through that Service, under the job name
// the RelaydDown alert reads.
func checkServiceAndMonitor(f *facts, b *bundle, p *problems) {
	d, c := b.relay(p)
	if c == nil {
		return
	}
	podLabels := d.Spec.Template.Labels
	if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, podLabels) {
		p.add("the Deployment's selector does not match its pods")
	}
	if len(b.services) != 1 || len(b.pdbs) != 1 {
		p.add("%d Services and %d PodDisruptionBudgets, want 1 and 1", len(b.services), len(b.pdbs))
		return
	}
	svc, pdb := b.services[0], b.pdbs[0]
	if pdb.Spec.Selector == nil {
		pdb.Spec.Selector = &metav1.LabelSelector{}
	}
	for what, sel := range map[string]map[string]string{"Service": svc.Spec.Selector, "PodDisruptionBudget": pdb.Spec.Selector.MatchLabels} {
		if !selects(sel, podLabels) {
			p.add("the %s's selector %v does not match the relay's pods %v", what, sel, podLabels)
		}
		for _, j := range b.jobs {
			if selects(sel, j.Spec.Template.Labels) {
				p.add("the %s's selector %v matches Job %s's pods", what, sel, j.Name)
			}
		}
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		p.add("the PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
	}
	if !svc.Spec.PublishNotReadyAddresses {
		p.add("Service %s leaves unready pods out: their metrics go unscraped during an outage", svc.Name)
	}
	metricsPort := containerPort(c, intstr.FromString("metrics"))
	ports := map[string]bool{}
	for _, sp := range svc.Spec.Ports {
		ports[sp.Name] = true
		if got := containerPort(c, sp.TargetPort); got == 0 || got != metricsPort {
			p.add("Service port %s targets %s (%d), not the metrics port %d", sp.Name, sp.TargetPort.String(), got, metricsPort)
		}
	}
	if b.name != "base" && len(b.svcMonitors) != 1 {
		p.add("%d ServiceMonitors, want 1", len(b.svcMonitors))
	}
	for _, sm := range b.svcMonitors {
		if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
			p.add("ServiceMonitor %s does not select Service %s", sm.Name, svc.Name)
		}
		if got := svc.Labels[sm.Spec.JobLabel]; got != f.job {
			p.add("ServiceMonitor %s: the job label, from the Service's label %q, is %q; alerts.yml reads up{job=%q}", sm.Name, sm.Spec.JobLabel, got, f.job)
		}
		if len(sm.Spec.Endpoints) == 0 {
			p.add("ServiceMonitor %s has no endpoints", sm.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			if !ports[ep.Port] {
				p.add("ServiceMonitor %s scrapes port %q, not one of Service %s's", sm.Name, ep.Port, svc.Name)
			}
			if path := cmp.Or(ep.Path, "/metrics"); path != "/metrics" || !f.served[path] {
				p.add("ServiceMonitor %s scrapes %s, want /metrics", sm.Name, path)
			}
		}
	}
}

// Without KEDA, two replicas. With it, the ScaledObject owns the count (at
// least two) and the Deployment sets none, scaling its own Deployment on the
// lag, a metric relayd exports.
func checkReplicasAndKEDA(f *facts, b *bundle, p *problems) {
	d, _ := b.relay(p)
	if d == nil {
		return
	}
	if len(b.scaled) == 0 {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			p.add("replicas %s, want 2", ptrString(d.Spec.Replicas))
		}
		return
	}
	if d.Spec.Replicas != nil {
		p.add("the Deployment sets replicas %d beside a ScaledObject: every apply would reset KEDA's count", *d.Spec.Replicas)
	}
	for _, so := range b.scaled {
		ref := so.Spec.ScaleTargetRef
		if ref.Name != d.Name || cmp.Or(ref.Kind, "Deployment") != "Deployment" {
			p.add("ScaledObject %s scales %s %s, not Deployment %s", so.Name, ref.Kind, ref.Name, d.Name)
		}
		lo, hi := so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount
		if lo == nil || *lo < 2 || hi == nil || *hi < *lo {
			p.add("ScaledObject %s: replicas from %s to %s, want at least 2 and a maximum above", so.Name, ptrString(lo), ptrString(hi))
		}
		if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "prometheus" {
			p.add("ScaledObject %s: want one prometheus trigger", so.Name)
			continue
		}
		md := so.Spec.Triggers[0].Metadata
		if md["serverAddress"] == "" {
			p.add("ScaledObject %s: no serverAddress", so.Name)
		}
		if _, err := strconv.ParseFloat(md["threshold"], 64); err != nil {
			p.add("ScaledObject %s: threshold %q is not a number", so.Name, md["threshold"])
		}
		if !metricRef.MatchString(md["query"]) || !strings.Contains(md["query"], "relayd_outbox_lag_seconds") {
			p.add("ScaledObject %s does not scale on relayd_outbox_lag_seconds: %s", so.Name, md["query"])
		}
		for _, m := range metricRef.FindAllStringSubmatch(md["query"], -1) {
			if f.exported[m[1]] == "" {
				p.add("ScaledObject %s queries %s, which relayd does not export", so.Name, m[1])
			}
		}
	}
}

// The relay's pods migrate before relaying: an init container runs
// `relayd migrate up` from the relay's image, against its database, as a
// role of its own.
func checkMigratesFirst(f *facts, b *bundle, p *problems) {
	d, c := b.relay(p)
	if c == nil {
		return
	}
	inits := d.Spec.Template.Spec.InitContainers
	i := slices.IndexFunc(inits, func(c corev1.Container) bool { return slices.Equal(c.Args, []string{"migrate", "up"}) })
	if i < 0 {
		p.add("no init container runs `relayd migrate up`")
		return
	}
	if inits[i].Image != c.Image {
		p.add("migrate runs image %s, the relay %s: the migrations must be the relay's", inits[i].Image, c.Image)
	}
	if b.name == "base" {
		return
	}
	// The same database as the relay's, as a role that may change its tables
	// (the relay's may not: docs/deploying.md, "Postgres privileges").
	relayEnv, migrateEnv := b.env(c, f.defaults), b.env(&inits[i], f.defaults)
	relayURL, err1 := url.Parse(relayEnv["RELAY_DATABASE_URL"])
	migrateURL, err2 := url.Parse(migrateEnv["RELAY_DATABASE_URL"])
	switch {
	case err1 != nil || err2 != nil || relayURL.Host == "":
		p.add("RELAY_DATABASE_URL: the relay's %q, migrate's %q", relayEnv["RELAY_DATABASE_URL"], migrateEnv["RELAY_DATABASE_URL"])
	case relayURL.Host != migrateURL.Host || relayURL.Path != migrateURL.Path:
		p.add("migrate's database %s%s is not the relay's %s%s", migrateURL.Host, migrateURL.Path, relayURL.Host, relayURL.Path)
	case relayURL.User.Username() == migrateURL.User.Username():
		p.add("migrate runs as the relay's role %q", relayURL.User.Username())
	case relayEnv["RELAY_DATABASE_PASSWORD_FILE"] == migrateEnv["RELAY_DATABASE_PASSWORD_FILE"]:
		p.add("migrate's role reads the relay's password file %s", relayEnv["RELAY_DATABASE_PASSWORD_FILE"])
	}
}

// Each check fails when what it checks is broken: every case breaks one
// thing in a fresh decode of a build and expects that check to say so.
func TestKubernetesChecksCatchBreakage(t *testing.T) {
	f := readFacts(t)
	relayOf := func(b *bundle) (*appsv1.Deployment, *corev1.Container) {
		var p problems
		d, c := b.relay(&p)
		if c == nil {
			t.Fatal(p)
		}
		return d, c
	}
	setConfig := func(b *bundle, k, v string) {
		for _, cm := range b.configMaps {
			cm.Data[k] = v
		}
	}
	initC := func(b *bundle) *corev1.Container { d, _ := relayOf(b); return &d.Spec.Template.Spec.InitContainers[0] }
	job := func(b *bundle) *batchv1.Job { return b.jobs[0] }
	cases := []struct {
		check, what, dir string
		breakIt          func(b *bundle)
	}{
		{"probes", "liveness on /readyz", allOverlay, func(b *bundle) { _, c := relayOf(b); c.LivenessProbe.HTTPGet.Path = "/readyz" }},
		{"probes", "readiness on a path relayd does not serve", allOverlay, func(b *bundle) { _, c := relayOf(b); c.ReadinessProbe.HTTPGet.Path = "/ready" }},
		{"probes", "a probe on another port", allOverlay, func(b *bundle) { _, c := relayOf(b); c.StartupProbe.HTTPGet.Port = intstr.FromInt32(8080) }},
		{"probes", "metrics on loopback", "base", func(b *bundle) { setConfig(b, "RELAY_METRICS_ADDR", "127.0.0.1:9090") }},
		{"env", "a misspelt variable", allOverlay, func(b *bundle) {
			_, c := relayOf(b)
			c.Env = append(c.Env, corev1.EnvVar{Name: "RELAY_WORKER", Value: "4"})
		}},
		{"env", "a misspelt ConfigMap key", "base", func(b *bundle) { setConfig(b, "RELAY_STATS_INTERVALS", "5s") }},
		{"env", "a missing ConfigMap", "base", func(b *bundle) { clear(b.configMaps) }},
		{"times", "the grace period equal to the shutdown timeout", allOverlay, func(b *bundle) {
			d, _ := relayOf(b)
			d.Spec.Template.Spec.TerminationGracePeriodSeconds = new(int64(30))
		}},
		{"times", "a shutdown timeout past the grace period", "base", func(b *bundle) { setConfig(b, "RELAY_SHUTDOWN_TIMEOUT", "60s") }},
		{"times", "no startup probe", allOverlay, func(b *bundle) { _, c := relayOf(b); c.StartupProbe = nil }},
		{"security", "a writable root filesystem", allOverlay, func(b *bundle) { initC(b).SecurityContext.ReadOnlyRootFilesystem = new(false) }},
		{"security", "no numeric uid", allOverlay, func(b *bundle) { d, _ := relayOf(b); d.Spec.Template.Spec.SecurityContext.RunAsUser = nil }},
		{"security", "runAsNonRoot off in the backfill", allOverlay, func(b *bundle) { job(b).Spec.Template.Spec.SecurityContext.RunAsNonRoot = nil }},
		{"security", "a capability added", allOverlay, func(b *bundle) {
			job(b).Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}},
		{"security", "privilege escalation", allOverlay, func(b *bundle) {
			_, c := relayOf(b)
			c.SecurityContext.AllowPrivilegeEscalation = nil
		}},
		{"resources", "a memory request below the peak RSS", allOverlay, func(b *bundle) {
			_, c := relayOf(b)
			c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("32Mi")
		}},
		{"resources", "no memory limit", allOverlay, func(b *bundle) { delete(initC(b).Resources.Limits, corev1.ResourceMemory) }},
		{"resources", "no CPU request", allOverlay, func(b *bundle) {
			delete(job(b).Spec.Template.Spec.Containers[0].Resources.Requests, corev1.ResourceCPU)
		}},
		{"secrets", "a Secret in the base", "base", func(b *bundle) { b.secrets["relayd"] = &corev1.Secret{} }},
		{"secrets", "a password in the base", "base", func(b *bundle) { b.raw = append(b.raw, "x: amqp://u:pw@h/\n"...) }},
		{"secrets", "a password in a URL", allOverlay, func(b *bundle) { setConfig(b, "RELAY_DATABASE_URL", "postgres://relayd:pw@h/db") }},
		{"secrets", "a Secret's value in the environment", "base", func(b *bundle) {
			_, c := relayOf(b)
			c.Env = append(c.Env, corev1.EnvVar{Name: "RELAY_NATS_NKEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "nkey"}}})
		}},
		{"secrets", "a key the Secret lacks", allOverlay, func(b *bundle) { setConfig(b, "RELAY_DATABASE_PASSWORD_FILE", "/etc/relayd/secrets/db-password") }},
		{"secrets", "a file on no volume", "base", func(b *bundle) { setConfig(b, "RELAY_NATS_CREDS", "/var/run/nats.creds") }},
		{"secrets", "a writable mount", allOverlay, func(b *bundle) { initC(b).VolumeMounts[0].ReadOnly = false }},
		{"secrets", "a real value in the example", allOverlay, func(b *bundle) {
			for _, s := range b.secrets {
				s.Data["database-url"] = []byte("postgres://relayd:hunter2@db/app")
			}
		}},
		{"rules", "a rule left out", allOverlay, func(b *bundle) {
			g := &b.rules[0].Spec.Groups[0]
			g.Rules = g.Rules[1:]
		}},
		{"rules", "a threshold changed", allOverlay, func(b *bundle) {
			r := &b.rules[0].Spec.Groups[0].Rules[0]
			r.Expr = intstr.FromString(strings.Replace(r.Expr.String(), "> 60", "> 600", 1))
		}},
		{"service", "unready pods left out", allOverlay, func(b *bundle) { b.services[0].Spec.PublishNotReadyAddresses = false }},
		{"service", "the job named from the Service's name", allOverlay, func(b *bundle) { b.svcMonitors[0].Spec.JobLabel = "" }},
		{"service", "a PDB that takes in the backfill", allOverlay, func(b *bundle) {
			b.pdbs[0].Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "relayd"}
		}},
		{"service", "a Service on another port", allOverlay, func(b *bundle) { b.services[0].Spec.Ports[0].TargetPort = intstr.FromInt32(9091) }},
		{"service", "a ServiceMonitor on another path", allOverlay, func(b *bundle) { b.svcMonitors[0].Spec.Endpoints[0].Path = "/stats" }},
		{"replicas", "one replica", "base", func(b *bundle) { d, _ := relayOf(b); d.Spec.Replicas = new(int32(1)) }},
		{"replicas", "replicas beside the ScaledObject", allOverlay, func(b *bundle) { d, _ := relayOf(b); d.Spec.Replicas = new(int32(2)) }},
		{"replicas", "scaling to one", allOverlay, func(b *bundle) { b.scaled[0].Spec.MinReplicaCount = new(int32(1)) }},
		{"replicas", "a metric relayd does not export", allOverlay, func(b *bundle) {
			md := b.scaled[0].Spec.Triggers[0].Metadata
			md["query"] = strings.ReplaceAll(md["query"], "relayd_outbox_stats_timestamp_seconds", "relayd_stats_timestamp_seconds")
		}},
		{"replicas", "another Deployment scaled", allOverlay, func(b *bundle) { b.scaled[0].Spec.ScaleTargetRef.Name = "relay" }},
		{"migrate", "no migration", allOverlay, func(b *bundle) { d, _ := relayOf(b); d.Spec.Template.Spec.InitContainers = nil }},
		{"migrate", "another image", allOverlay, func(b *bundle) { initC(b).Image = "relayd:old" }},
		{"migrate", "the relay's role", allOverlay, func(b *bundle) {
			for name, cm := range b.configMaps {
				if strings.Contains(name, "migrate") {
					cm.Data["RELAY_DATABASE_URL"] = "postgres://relayd@postgres.example.internal:5432/app?sslmode=verify-full"
				}
			}
		}},
		{"migrate", "the relay's password", allOverlay, func(b *bundle) {
			for name, cm := range b.configMaps {
				if strings.Contains(name, "migrate") {
					delete(cm.Data, "RELAY_DATABASE_PASSWORD_FILE")
				}
			}
		}},
		{"scope", "an alert of every deployment", allOverlay, func(b *bundle) {
			r := &b.rules[0].Spec.Groups[0].Rules[2]
			r.Expr = intstr.FromString(strings.ReplaceAll(r.Expr.String(), `,service="relayd"`, ""))
		}},
		{"scope", "KEDA's query in another namespace", allOverlay, func(b *bundle) {
			md := b.scaled[0].Spec.Triggers[0].Metadata
			md["query"] = strings.Replace(md["query"], `namespace="relayd"`, `namespace="shop"`, 1)
		}},
		{"labelled", "an object without the instance label", "overlays/estate" + allSuffix, func(b *bundle) { delete(b.streams[1].Labels, instanceLabel) }},
		{"labelled", "an object of no deployment", allOverlay, func(b *bundle) { b.accounts[0].Labels[instanceLabel] = "relay" }},
		{"network", "ingress from anywhere", allOverlay, func(b *bundle) { b.netpols[0].Spec.Ingress[0].From = nil }},
		{"network", "ingress on another port", allOverlay, func(b *bundle) { b.netpols[0].Spec.Ingress[0].Ports[0].Port = new(intstr.FromInt32(8080)) }},
		{"network", "no DNS", allOverlay, func(b *bundle) {
			np := b.netpols[0]
			np.Spec.Egress = slices.DeleteFunc(np.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool {
				return slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.IntVal == 53 })
			})
		}},
		{"network", "no way to the other relays' /version", allOverlay, func(b *bundle) { b.netpols[0].Spec.Egress[0].To = nil }},
		{"network", "a broker port only to the relays", allOverlay, func(b *bundle) {
			np := b.netpols[0]
			for i := range np.Spec.Egress {
				if len(np.Spec.Egress[i].To) == 0 && slices.ContainsFunc(np.Spec.Egress[i].Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.IntVal == 5671 }) {
					np.Spec.Egress[i].To = np.Spec.Egress[0].To
				}
			}
		}},
		{"network", "a broker port not let out", allOverlay, func(b *bundle) { setConfig(b, "RELAY_AMQP_URL", "amqps://relayd@rabbitmq:5673/") }},
		{"network", "the backfill's pods left out", allOverlay, func(b *bundle) { job(b).Spec.Template.Labels = map[string]string{"app": "x"} }},
		{"stream", "another stream's name", "overlays/estate" + allSuffix, func(b *bundle) { b.streams[0].Spec.Name = "OUTBOX" }},
		{"stream", "another subject prefix", allOverlay, func(b *bundle) { setConfig(b, "RELAY_NATS_SUBJECT_PREFIX", "events.") }},
		{"stream", "one replica", allOverlay, func(b *bundle) { b.streams[0].Spec.Replicas = 1 }},
		{"stream", "a duplicate window shorter than relayd's", allOverlay, func(b *bundle) { setConfig(b, "RELAY_NATS_DUPLICATE_WINDOW", "5m") }},
		{"account", "the namespace's default account", allOverlay, func(b *bundle) { job(b).Spec.Template.Spec.ServiceAccountName = "" }},
		{"account", "a token mounted", allOverlay, func(b *bundle) { b.accounts[0].AutomountServiceAccountToken = new(true) }},
		{"names", "two Services of one name", "overlays/estate", func(b *bundle) { b.services[1].Name = b.services[0].Name }},
		{"dashboard", "a dashboard per deployment", "overlays/estate", func(b *bundle) {
			for name, cm := range b.configMaps {
				if strings.HasPrefix(name, "orders-relayd-") && !strings.Contains(name, "migrate") {
					cm.Labels["grafana_dashboard"] = "1"
				}
			}
		}},
		{"dashboard", "an edited copy", allOverlay, func(b *bundle) {
			for _, cm := range b.configMaps {
				if cm.Labels["grafana_dashboard"] == "1" {
					cm.Data["relayd-dashboard.json"] = "{}"
				}
			}
		}},
		{"selectors", "a PDB over both deployments", "overlays/estate", func(b *bundle) { delete(b.pdbs[0].Spec.Selector.MatchLabels, instanceLabel) }},
		{"selectors", "a ServiceMonitor over both deployments", "overlays/estate", func(b *bundle) {
			delete(b.svcMonitors[0].Spec.Selector.MatchLabels, instanceLabel)
		}},
		{"selectors", "a spread over both deployments", "overlays/estate", func(b *bundle) {
			delete(b.deployments[0].Spec.Template.Spec.TopologySpreadConstraints[0].LabelSelector.MatchLabels, instanceLabel)
		}},
	}
	all := maps.Clone(checks)
	maps.Copy(all, estateChecks)
	for name := range all {
		if !slices.ContainsFunc(cases, func(c struct {
			check, what, dir string
			breakIt          func(b *bundle)
		}) bool {
			return c.check == name
		}) {
			t.Errorf("check %s has no case that breaks it", name)
		}
	}
	// A deployment's checks see the first deployment of the build; the
	// estate's, the whole build.
	build := func(check, dir string) *bundle {
		b := kustomize(t, dir)
		if _, ok := estateChecks[check]; ok {
			return b
		}
		return b.split()[0]
	}
	for _, tc := range cases {
		t.Run(tc.check+"/"+tc.what, func(t *testing.T) {
			var p problems
			all[tc.check](f, build(tc.check, tc.dir), &p)
			if len(p) > 0 {
				t.Fatalf("%s fails on the unbroken %s: %v", tc.check, tc.dir, p)
			}
			b := build(tc.check, tc.dir)
			tc.breakIt(b)
			all[tc.check](f, b, &p)
			if len(p) == 0 {
				t.Errorf("check %s passes %s with %s", tc.check, tc.dir, tc.what)
			}
			t.Log(p)
		})
	}
}

// With the stream component, the Stream is the one relayd publishes to: the
// name and subjects of its settings, R3 on file storage, and a duplicate
// window not shorter than relayd's.
func checkStream(f *facts, b *bundle, p *problems) {
	_, c := b.relay(p)
	if c == nil || len(b.streams) == 0 {
		return
	}
	env := b.env(c, f.defaults)
	for _, st := range b.streams {
		if st.Spec.Name != env["RELAY_NATS_STREAM"] {
			p.add("Stream %s is named %q, relayd publishes to %q", st.Name, st.Spec.Name, env["RELAY_NATS_STREAM"])
		}
		if want := []string{env["RELAY_NATS_SUBJECT_PREFIX"] + ">"}; !slices.Equal(st.Spec.Subjects, want) {
			p.add("Stream %s takes %v, relayd publishes to %v", st.Name, st.Spec.Subjects, want)
		}
		if st.Spec.Replicas < 3 || st.Spec.Storage != "file" {
			p.add("Stream %s: %d replicas on %q storage, want 3 on file", st.Name, st.Spec.Replicas, st.Spec.Storage)
		}
		window, err1 := time.ParseDuration(st.Spec.DuplicateWindow)
		relayd, err2 := time.ParseDuration(env["RELAY_NATS_DUPLICATE_WINDOW"])
		if err1 != nil || err2 != nil || window < relayd {
			p.add("Stream %s: duplicate window %q, shorter than RELAY_NATS_DUPLICATE_WINDOW %q", st.Name, st.Spec.DuplicateWindow, env["RELAY_NATS_DUPLICATE_WINDOW"])
		}
	}
}
