package deploy

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
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
	// allOverlay is the test's own: the example overlay with the backfill
	// line uncommented, as its comment tells whoever runs one.
	allOverlay   = "overlays/all"
	backfillLine = "# - ../../components/backfill"
)

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

// kinds maps each kind the manifests may hold to its apiVersion and a new
// value of its Go type. Any other kind fails the build check.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Namespace":           {"v1", func() any { return &corev1.Namespace{} }},
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
}

// bundle is one kustomize build, decoded.
type bundle struct {
	name        string
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	services    []*corev1.Service
	deployments []*appsv1.Deployment
	jobs        []*batchv1.Job
	pdbs        []*policyv1.PodDisruptionBudget
	svcMonitors []*monitoringv1.ServiceMonitor
	rules       []*monitoringv1.PrometheusRule
	scaled      []*scaledObject
	raw         []byte
}

// kustomize builds dir (relative to kubernetes/) from an in-memory copy of
// kubernetes/ with the test's overlay added, and decodes every object
// strictly.
func kustomize(t *testing.T, dir string) *bundle {
	t.Helper()
	raw, err := buildYAML(dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	b, err := decode(dir, raw)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return b
}

func buildYAML(dir string) ([]byte, error) {
	fsys := filesys.MakeFsInMemory()
	err := filepath.WalkDir(k8sDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		path = filepath.ToSlash(path)
		if rest, ok := strings.CutPrefix(path, k8sDir+"/overlays/example/"); ok {
			if err := fsys.WriteFile("/"+k8sDir+"/"+allOverlay+"/"+rest, data); err != nil {
				return err
			}
		}
		return fsys.WriteFile("/"+path, data)
	})
	if err != nil {
		return nil, err
	}
	kf := "/" + k8sDir + "/" + allOverlay + "/kustomization.yaml"
	example, err := fsys.ReadFile(kf)
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(example, []byte(backfillLine)) {
		return nil, fmt.Errorf("overlays/example/kustomization.yaml: no %q line to uncomment", backfillLine)
	}
	all := bytes.Replace(example, []byte(backfillLine), []byte(strings.TrimPrefix(backfillLine, "# ")), 1)
	if err := fsys.WriteFile(kf, all); err != nil {
		return nil, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, "/"+k8sDir+"/"+dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}

func decode(name string, raw []byte) (*bundle, error) {
	b := &bundle{name: name, raw: raw, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
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
		}
	}
	return b, nil
}

// pod is one pod template of the bundle, named for its owner.
type pod struct {
	owner string
	spec  *corev1.PodSpec
	meta  *metav1.ObjectMeta
}

func (b *bundle) pods() []pod {
	var out []pod
	for _, d := range b.deployments {
		out = append(out, pod{"Deployment " + d.Name, &d.Spec.Template.Spec, &d.Spec.Template.ObjectMeta})
	}
	for _, j := range b.jobs {
		out = append(out, pod{"Job " + j.Name, &j.Spec.Template.Spec, &j.Spec.Template.ObjectMeta})
	}
	return out
}

// relay returns the relay Deployment and its relayd container.
func (b *bundle) relay(t *testing.T) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	if len(b.deployments) != 1 {
		t.Fatalf("%s: %d Deployments, want the one relayd", b.name, len(b.deployments))
	}
	d := b.deployments[0]
	for i, c := range d.Spec.Template.Spec.Containers {
		if slices.Equal(c.Args, []string{"run"}) {
			return d, &d.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("%s: Deployment %s has no container running `relayd run`", b.name, d.Name)
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
				maps.Copy(out, cm.Data)
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
	if vars["RELAY_DATABASE_URL"] != "" || len(vars) < 20 {
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
// overlay, and the example with every component.
var builds = []string{"base", "overlays/example", allOverlay}

func TestKubernetesBuildsAndDecodesStrictly(t *testing.T) {
	for _, dir := range builds {
		b := kustomize(t, dir)
		if len(b.deployments) == 0 {
			t.Errorf("%s: no Deployment", dir)
		}
	}
	// The strict decode refuses a field the type lacks.
	bad := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n")
	if _, err := decode("bad", bad); err == nil {
		t.Error("a Deployment with spec.replica (a typo) decoded without error: the decode is not strict")
	}
}

// The relay's probes are the paths relayd serves, on the port relayd
// listens on: /healthz for liveness and start-up, /readyz for readiness
// (never for liveness: a broker outage fails it everywhere).
func TestKubernetesProbes(t *testing.T) {
	served := servedPaths(t)
	defaults := relaydEnv(t)
	for _, dir := range builds {
		b := kustomize(t, dir)
		_, c := b.relay(t)
		addr := b.env(c, defaults)["RELAY_METRICS_ADDR"]
		port := requireAllInterfaces(t, dir+": RELAY_METRICS_ADDR", addr)
		want := map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe}
		if c.StartupProbe != nil {
			want["/healthz "] = c.StartupProbe // a second /healthz
		}
		for path, p := range want {
			path = strings.TrimSpace(path)
			if p == nil || p.HTTPGet == nil {
				t.Errorf("%s: no httpGet probe for %s", dir, path)
				continue
			}
			if p.HTTPGet.Path != path || !served[path] {
				t.Errorf("%s: probe path %q, want %s, which relayd serves (%v)", dir, p.HTTPGet.Path, path, slices.Sorted(maps.Keys(served)))
			}
			if got := containerPort(c, p.HTTPGet.Port); strconv.Itoa(int(got)) != port {
				t.Errorf("%s: probe %s on port %v (%d), but relayd listens on %s", dir, path, p.HTTPGet.Port.String(), got, addr)
			}
		}
	}
}

// containerPort resolves a probe's or Service's port, named or numbered.
func containerPort(c *corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// Every variable a container is given is one relayd reads: a misspelt
// RELAY_* would be ignored silently.
func TestKubernetesEnvNamesAreRelayds(t *testing.T) {
	known := relaydEnv(t)
	for _, name := range envNotTagged {
		known[name] = ""
	}
	for _, dir := range builds {
		b := kustomize(t, dir)
		checked := 0
		for _, p := range b.pods() {
			for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
				var names []string
				for _, e := range c.Env {
					names = append(names, e.Name)
				}
				for _, from := range c.EnvFrom {
					if from.ConfigMapRef != nil {
						cm := b.configMaps[from.ConfigMapRef.Name]
						if cm == nil {
							t.Errorf("%s: %s container %s: envFrom ConfigMap %s is not in the build", dir, p.owner, c.Name, from.ConfigMapRef.Name)
							continue
						}
						for key := range cm.Data {
							names = append(names, from.Prefix+key)
						}
					}
					if from.SecretRef != nil {
						t.Errorf("%s: %s container %s: envFrom a Secret: name each variable with secretKeyRef", dir, p.owner, c.Name)
					}
				}
				for _, name := range names {
					checked++
					if _, ok := known[name]; !ok {
						t.Errorf("%s: %s container %s sets %s, which relayd does not read", dir, p.owner, c.Name, name)
					}
				}
			}
		}
		if checked < 5 {
			t.Errorf("%s: only %d variables found", dir, checked)
		}
	}
}

// duration reads a relayd duration setting as relayd would.
func duration(t *testing.T, env map[string]string, name string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(env[name])
	if err != nil {
		t.Fatalf("%s=%q: %v", name, env[name], err)
	}
	return d
}

// The kubelet waits longer than relayd lets in-flight batches finish
// (RELAY_PUBLISH_TIMEOUT < RELAY_SHUTDOWN_TIMEOUT < the grace period,
// docs/deploying.md), and the start-up probe longer than relayd waits for
// Postgres, NATS and RabbitMQ one after the other.
func TestKubernetesShutdownAndStartupTimes(t *testing.T) {
	defaults := relaydEnv(t)
	for _, dir := range builds {
		b := kustomize(t, dir)
		d, c := b.relay(t)
		env := b.env(c, defaults)
		shutdown := duration(t, env, "RELAY_SHUTDOWN_TIMEOUT")
		publish := duration(t, env, "RELAY_PUBLISH_TIMEOUT")
		grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
		if grace == nil || time.Duration(*grace)*time.Second <= shutdown {
			t.Errorf("%s: terminationGracePeriodSeconds %v, want more than RELAY_SHUTDOWN_TIMEOUT %v", dir, ptrString(grace), shutdown)
		}
		if publish >= shutdown {
			t.Errorf("%s: RELAY_PUBLISH_TIMEOUT %v, want less than RELAY_SHUTDOWN_TIMEOUT %v", dir, publish, shutdown)
		}
		startup := 3 * duration(t, env, "RELAY_STARTUP_TIMEOUT")
		if p := c.StartupProbe; p == nil {
			t.Errorf("%s: no startup probe: relayd serves /healthz only once it has connected (up to %v)", dir, startup)
		} else if budget := time.Duration(p.InitialDelaySeconds+p.PeriodSeconds*p.FailureThreshold) * time.Second; budget < startup {
			t.Errorf("%s: the startup probe gives up after %v, before relayd's own start-up waits (%v)", dir, budget, startup)
		}
	}
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// Every container of every pod runs as a numeric non-root uid (the image's
// USER is a name, which the kubelet cannot check), on a read-only root
// filesystem, with no capabilities and no privilege escalation.
func TestKubernetesPodsAreRestricted(t *testing.T) {
	for _, dir := range builds {
		b := kustomize(t, dir)
		for _, p := range b.pods() {
			psc := p.spec.SecurityContext
			if psc == nil {
				psc = &corev1.PodSecurityContext{}
			}
			for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
				where := fmt.Sprintf("%s: %s container %s", dir, p.owner, c.Name)
				sc := c.SecurityContext
				if sc == nil {
					sc = &corev1.SecurityContext{}
				}
				nonRoot, uid := cmpOr(sc.RunAsNonRoot, psc.RunAsNonRoot), cmpOr(sc.RunAsUser, psc.RunAsUser)
				if nonRoot == nil || !*nonRoot {
					t.Errorf("%s: runAsNonRoot is not true", where)
				}
				if uid == nil || *uid == 0 {
					t.Errorf("%s: runAsUser %s, want a numeric non-root uid", where, ptrString(uid))
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: readOnlyRootFilesystem is not true", where)
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: allowPrivilegeEscalation is not false", where)
				}
				if sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s: privileged", where)
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s: capabilities %+v, want drop ALL and add none", where, sc.Capabilities)
				}
			}
		}
	}
}

// cmpOr is the container's setting if set, else the pod's.
func cmpOr[T any](c, p *T) *T {
	if c != nil {
		return c
	}
	return p
}

// peakRSS returns the largest peak RSS in docs/performance.md's tables.
func peakRSS(t *testing.T) resource.Quantity {
	t.Helper()
	data, err := os.ReadFile("../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	var peak int64
	col := -1
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if !strings.HasPrefix(sc.Text(), "|") {
			col = -1
			continue
		}
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
func TestKubernetesResourcesFromTheBench(t *testing.T) {
	peak := peakRSS(t)
	for _, dir := range builds {
		b := kustomize(t, dir)
		for _, p := range b.pods() {
			for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
				where := fmt.Sprintf("%s: %s container %s", dir, p.owner, c.Name)
				req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
				if req.Cmp(peak) < 0 {
					t.Errorf("%s: memory request %v, below the bench's peak RSS %v", where, req, &peak)
				}
				if lim.IsZero() || lim.Cmp(*req) <= 0 {
					t.Errorf("%s: memory limit %v, want one above the request %v", where, lim, req)
				}
				if c.Resources.Requests.Cpu().IsZero() {
					t.Errorf("%s: no CPU request", where)
				}
			}
		}
	}
}

// secretVars are the settings that carry credentials.
var secretVars = []string{"RELAY_DATABASE_URL", "RELAY_AMQP_URL", "RELAY_NATS_URL"}

var userinfo = regexp.MustCompile(`[a-z]+://[^/@\s:]+:[^/@\s]+@`)

// The base ships no credentials: no Secret, the URLs only from a Secret
// reference, no password in a URL anywhere. An overlay's build has every
// Secret and key the pods refer to.
func TestKubernetesSecretsNotInBase(t *testing.T) {
	for _, dir := range builds {
		b := kustomize(t, dir)
		base := dir == "base"
		if base && len(b.secrets) > 0 {
			t.Errorf("base: ships Secrets %v", slices.Collect(maps.Keys(b.secrets)))
		}
		if base && userinfo.Match(b.raw) {
			t.Errorf("base: a URL with a password: %s", userinfo.Find(b.raw))
		}
		for _, cm := range b.configMaps {
			for k := range cm.Data {
				if slices.Contains(secretVars, k) {
					t.Errorf("%s: ConfigMap %s holds %s: it belongs in a Secret", dir, cm.Name, k)
				}
			}
		}
		for _, p := range b.pods() {
			for _, c := range slices.Concat(p.spec.InitContainers, p.spec.Containers) {
				for _, e := range c.Env {
					ref := (*corev1.SecretKeySelector)(nil)
					if e.ValueFrom != nil {
						ref = e.ValueFrom.SecretKeyRef
					}
					if slices.Contains(secretVars, e.Name) && ref == nil {
						t.Errorf("%s: %s container %s: %s is not from a Secret", dir, p.owner, c.Name, e.Name)
					}
					if ref == nil || base {
						continue
					}
					if s := b.secrets[ref.Name]; s == nil {
						t.Errorf("%s: %s container %s: %s from Secret %s, not in the build", dir, p.owner, c.Name, e.Name, ref.Name)
					} else if _, ok := s.Data[ref.Key]; !ok {
						t.Errorf("%s: %s container %s: %s from key %s, which Secret %s lacks", dir, p.owner, c.Name, e.Name, ref.Key, ref.Name)
					}
				}
			}
		}
		if !base {
			for _, s := range b.secrets {
				for k, v := range s.Data {
					if !bytes.Contains(v, []byte("REPLACE-ME")) {
						t.Errorf("%s: Secret %s key %s is not a REPLACE-ME placeholder", dir, s.Name, k)
					}
				}
			}
		}
	}
}

// alertsGroups reads alerts.yml strictly as the Prometheus Operator's
// rule groups.
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

// ruleHeader opens the generated PrometheusRule; alerts.yml's groups follow,
// indented under spec.
const ruleHeader = `# Generated from deploy/alerts.yml, the rules' one source (promtool tests it):
# edit that file, then run  go test ./deploy -run TestKubernetesPrometheusRule -update
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: relayd
  labels:
    app.kubernetes.io/name: relayd
    app.kubernetes.io/component: relay
spec:
`

// The PrometheusRule is alerts.yml: the same groups, rule for rule.
func TestKubernetesPrometheusRule(t *testing.T) {
	data, groups := alertsGroups(t)
	if *update {
		i := bytes.Index(data, []byte("\ngroups:"))
		if i < 0 {
			t.Fatal("alerts.yml: no top-level groups:")
		}
		var out bytes.Buffer
		out.WriteString(ruleHeader)
		for line := range strings.SplitSeq(strings.TrimRight(string(data[i+1:]), "\n"), "\n") {
			if line != "" {
				line = "  " + line
			}
			out.WriteString(line + "\n")
		}
		if err := os.WriteFile(ruleFile, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"overlays/example", allOverlay} {
		b := kustomize(t, dir)
		if len(b.rules) != 1 {
			t.Fatalf("%s: %d PrometheusRules, want 1", dir, len(b.rules))
		}
		if got := b.rules[0].Spec.Groups; !reflect.DeepEqual(got, groups) {
			t.Errorf("%s: the PrometheusRule's groups differ from alerts.yml's: run go test ./deploy -run TestKubernetesPrometheusRule -update\n got: %+v\nwant: %+v", dir, got, groups)
		}
	}
}

// selects reports whether a label selector matches labels.
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
// the backfill's; the Service's port is the relay's metrics port and
// publishes pods that are not ready (they are scraped through an outage).
// The ServiceMonitor scrapes a path relayd serves, through that Service,
// under the job name the RelaydDown alert reads.
func TestKubernetesServiceAndMonitor(t *testing.T) {
	served := servedPaths(t)
	alerts, _ := alertsGroups(t)
	m := regexp.MustCompile(`up\{job="([^"]+)"\}`).FindSubmatch(alerts)
	if m == nil {
		t.Fatal(`alerts.yml: no up{job="..."}`)
	}
	job := string(m[1])
	for _, dir := range builds {
		b := kustomize(t, dir)
		d, c := b.relay(t)
		podLabels := d.Spec.Template.Labels
		if !selects(d.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("%s: the Deployment's selector does not match its pods", dir)
		}
		if len(b.services) != 1 || len(b.pdbs) != 1 {
			t.Fatalf("%s: %d Services and %d PodDisruptionBudgets, want 1 and 1", dir, len(b.services), len(b.pdbs))
		}
		svc, pdb := b.services[0], b.pdbs[0]
		for what, sel := range map[string]map[string]string{"Service": svc.Spec.Selector, "PodDisruptionBudget": pdb.Spec.Selector.MatchLabels} {
			if !selects(sel, podLabels) {
				t.Errorf("%s: the %s's selector %v does not match the relay's pods %v", dir, what, sel, podLabels)
			}
			for _, j := range b.jobs {
				if selects(sel, j.Spec.Template.Labels) {
					t.Errorf("%s: the %s's selector %v matches Job %s's pods", dir, what, sel, j.Name)
				}
			}
		}
		if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
			t.Errorf("%s: the PodDisruptionBudget sets neither maxUnavailable nor minAvailable", dir)
		}
		if !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("%s: Service %s leaves unready pods out: their metrics go unscraped during an outage", dir, svc.Name)
		}
		ports := map[string]bool{}
		for _, p := range svc.Spec.Ports {
			ports[p.Name] = true
			metricsPort := containerPort(c, intstr.FromString("metrics"))
			if got := containerPort(c, p.TargetPort); got == 0 || got != metricsPort {
				t.Errorf("%s: Service port %s targets %s (%d), not the metrics port %d", dir, p.Name, p.TargetPort.String(), got, metricsPort)
			}
		}
		for _, sm := range b.svcMonitors {
			if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
				t.Errorf("%s: ServiceMonitor %s does not select Service %s", dir, sm.Name, svc.Name)
			}
			if got := svc.Labels[sm.Spec.JobLabel]; got != job {
				t.Errorf("%s: ServiceMonitor %s: job label from %q is %q, want %q (alerts.yml's up{job=%q})", dir, sm.Name, sm.Spec.JobLabel, got, job, job)
			}
			if len(sm.Spec.Endpoints) == 0 {
				t.Errorf("%s: ServiceMonitor %s has no endpoints", dir, sm.Name)
			}
			for _, ep := range sm.Spec.Endpoints {
				if !ports[ep.Port] {
					t.Errorf("%s: ServiceMonitor %s scrapes port %q, not one of Service %s's", dir, sm.Name, ep.Port, svc.Name)
				}
				if path := cmpOrString(ep.Path, "/metrics"); !served[path] || path != "/metrics" {
					t.Errorf("%s: ServiceMonitor %s scrapes %s, want /metrics", dir, sm.Name, path)
				}
			}
		}
		if dir != "base" && len(b.svcMonitors) != 1 {
			t.Errorf("%s: %d ServiceMonitors, want 1", dir, len(b.svcMonitors))
		}
	}
}

func cmpOrString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// The base runs two replicas. With KEDA, the ScaledObject owns the count
// (at least two) and the Deployment sets none, scaling the relay on a
// metric relayd exports.
func TestKubernetesReplicasAndKEDA(t *testing.T) {
	exported := exportedMetrics(t)
	for _, dir := range builds {
		b := kustomize(t, dir)
		d, _ := b.relay(t)
		if len(b.scaled) == 0 {
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
				t.Errorf("%s: replicas %s, want 2", dir, ptrString(d.Spec.Replicas))
			}
			if dir != "base" {
				t.Errorf("%s: no ScaledObject", dir)
			}
			continue
		}
		if d.Spec.Replicas != nil {
			t.Errorf("%s: the Deployment sets replicas %d beside a ScaledObject: every apply would reset KEDA's count", dir, *d.Spec.Replicas)
		}
		for _, so := range b.scaled {
			if so.Spec.ScaleTargetRef.Name != d.Name || cmpOrString(so.Spec.ScaleTargetRef.Kind, "Deployment") != "Deployment" {
				t.Errorf("%s: ScaledObject %s scales %s %s, not Deployment %s", dir, so.Name, so.Spec.ScaleTargetRef.Kind, so.Spec.ScaleTargetRef.Name, d.Name)
			}
			if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 2 {
				t.Errorf("%s: ScaledObject %s minReplicaCount %s, want at least 2", dir, so.Name, ptrString(so.Spec.MinReplicaCount))
			}
			if so.Spec.MaxReplicaCount == nil || *so.Spec.MaxReplicaCount < *cmpOr(so.Spec.MinReplicaCount, new(int32)) {
				t.Errorf("%s: ScaledObject %s maxReplicaCount %s", dir, so.Name, ptrString(so.Spec.MaxReplicaCount))
			}
			if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "prometheus" {
				t.Fatalf("%s: ScaledObject %s: want one prometheus trigger", dir, so.Name)
			}
			md := so.Spec.Triggers[0].Metadata
			for _, k := range []string{"serverAddress", "query", "threshold"} {
				if md[k] == "" {
					t.Errorf("%s: ScaledObject %s: prometheus trigger without %s", dir, so.Name, k)
				}
			}
			if _, err := strconv.ParseFloat(md["threshold"], 64); err != nil {
				t.Errorf("%s: ScaledObject %s: threshold %q is not a number", dir, so.Name, md["threshold"])
			}
			if !strings.Contains(md["query"], "relayd_outbox_lag_seconds") {
				t.Errorf("%s: ScaledObject %s does not scale on relayd_outbox_lag_seconds: %s", dir, so.Name, md["query"])
			}
			for _, ref := range metricRef.FindAllStringSubmatch(md["query"], -1) {
				if exported[ref[1]] == "" {
					t.Errorf("%s: ScaledObject %s queries %s, which relayd does not export", dir, so.Name, ref[1])
				}
			}
		}
	}
}

// The relay's pods migrate before relaying: an init container runs
// `relayd migrate up` against the relay's database.
func TestKubernetesMigratesFirst(t *testing.T) {
	for _, dir := range builds {
		b := kustomize(t, dir)
		d, c := b.relay(t)
		inits := d.Spec.Template.Spec.InitContainers
		i := slices.IndexFunc(inits, func(c corev1.Container) bool { return slices.Equal(c.Args, []string{"migrate", "up"}) })
		if i < 0 {
			t.Errorf("%s: no init container runs `relayd migrate up`", dir)
			continue
		}
		if inits[i].Image != c.Image {
			t.Errorf("%s: migrate runs image %s, the relay %s: the migrations must be the relay's", dir, inits[i].Image, c.Image)
		}
		dbURL := func(c *corev1.Container) string {
			for _, e := range c.Env {
				if e.Name == "RELAY_DATABASE_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
				}
			}
			return ""
		}
		if got, want := dbURL(&inits[i]), dbURL(c); got == "" || got != want {
			t.Errorf("%s: migrate's RELAY_DATABASE_URL from %q, the relay's from %q", dir, got, want)
		}
	}
}
