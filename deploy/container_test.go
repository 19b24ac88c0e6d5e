package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testenv"
)

// No Docker engine is needed: these read the Dockerfile, compose.yaml,
// .dockerignore and the Makefile for what can be checked offline.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	stage int // index of the FROM it belongs to
	cmd   string
	args  string
}

func dockerfile(t *testing.T) []instruction {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	stage, line := -1, ""
	for raw := range strings.SplitSeq(string(data), "\n") {
		raw = strings.TrimSpace(raw)
		if line == "" && (raw == "" || strings.HasPrefix(raw, "#")) {
			continue
		}
		if s, ok := strings.CutSuffix(raw, `\`); ok {
			line += s + " "
			continue
		}
		line += raw
		cmd, args, _ := strings.Cut(line, " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			stage++
		}
		out = append(out, instruction{stage: stage, cmd: cmd, args: strings.TrimSpace(args)})
		line = ""
	}
	return out
}

type composeFile struct {
	Services map[string]struct {
		Build struct {
			Context string            `yaml:"context"`
			Args    map[string]string `yaml:"args"`
		} `yaml:"build"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		Command     any               `yaml:"command"`
		Entrypoint  any               `yaml:"entrypoint"`
	} `yaml:"services"`
}

func compose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if _, ok := c.Services["relayd"]; !ok {
		t.Fatal("compose.yaml has no relayd service")
	}
	return c
}

// The version reaches the binary: compose passes VERSION as a build
// argument, `make up` sets it, and the build stage declares it before the
// go build that links it into main.version.
func TestImageIsBuiltWithTheVersion(t *testing.T) {
	relayd := compose(t).Services["relayd"]
	if v := relayd.Build.Args["VERSION"]; !strings.Contains(v, "${VERSION") {
		t.Errorf("compose.yaml relayd build args VERSION = %q, want it from ${VERSION...}", v)
	}
	declared := false
	linked := false
	for _, in := range dockerfile(t) {
		switch {
		case in.stage == 0 && in.cmd == "ARG" && strings.HasPrefix(in.args, "VERSION"):
			declared = true
		case in.stage == 0 && in.cmd == "RUN" && strings.Contains(in.args, "go build"):
			if !strings.Contains(in.args, "-X main.version=${VERSION}") {
				t.Errorf("Dockerfile: go build %q does not link -X main.version=${VERSION}", in.args)
			}
			if !declared {
				t.Error("Dockerfile: go build comes before ARG VERSION: the build would not see it")
			}
			linked = true
		}
	}
	if !linked {
		t.Error("Dockerfile: no go build in the first stage")
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\tVERSION="\$\(VERSION\)" docker compose up`).Match(mk) {
		t.Error("Makefile: `make up` does not pass VERSION to docker compose")
	}
}

// relayd's default metrics address is loopback: the image and compose set
// one that listens on every interface, on the port the image exposes and
// compose maps.
func TestImageMetricsAddressListensBeyondLocalhost(t *testing.T) {
	ins := dockerfile(t)
	last := ins[len(ins)-1].stage
	var addr string
	var exposed []string
	for _, in := range ins {
		if in.stage != last {
			continue
		}
		if v, ok := strings.CutPrefix(in.args, "RELAY_METRICS_ADDR="); ok && in.cmd == "ENV" {
			addr = strings.Trim(v, `"`)
		}
		if in.cmd == "EXPOSE" {
			exposed = append(exposed, strings.Fields(in.args)...)
		}
	}
	port := requireAllInterfaces(t, "Dockerfile ENV RELAY_METRICS_ADDR", addr)
	if !slices.Contains(exposed, port) {
		t.Errorf("Dockerfile EXPOSE %v: want the metrics port %s", exposed, port)
	}
	relayd := compose(t).Services["relayd"]
	port = requireAllInterfaces(t, "compose.yaml RELAY_METRICS_ADDR", relayd.Environment["RELAY_METRICS_ADDR"])
	mapped := false
	for _, p := range relayd.Ports {
		mapped = mapped || strings.HasSuffix(p, ":"+port)
	}
	if !mapped {
		t.Errorf("compose.yaml relayd ports %v: none maps the metrics port %s", relayd.Ports, port)
	}
}

// requireAllInterfaces fails unless addr is host:port with a host that is
// every interface; it returns the port.
func requireAllInterfaces(t *testing.T, what, addr string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s = %q: not host:port", what, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		t.Fatalf("%s = %q: want a fixed port", what, addr)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("%s = %q: want every interface (\":%s\" or \"0.0.0.0:%s\")", what, addr, port, port)
	}
	return port
}

// `docker run` with environment variables only runs the relay: the image's
// command is `relayd run`, and compose sets every variable relayd requires
// without overriding it.
func TestImageRunsWithEnvOnly(t *testing.T) {
	var entrypoint, cmd string
	ins := dockerfile(t)
	last := ins[len(ins)-1].stage
	for _, in := range ins {
		if in.stage == last && in.cmd == "ENTRYPOINT" {
			entrypoint = in.args
		}
		if in.stage == last && in.cmd == "CMD" {
			cmd = in.args
		}
	}
	if entrypoint != `["/relayd"]` || cmd != `["run"]` {
		t.Errorf("Dockerfile ENTRYPOINT %s CMD %s: want [\"/relayd\"] and [\"run\"]", entrypoint, cmd)
	}
	relayd := compose(t).Services["relayd"]
	if relayd.Command != nil || relayd.Entrypoint != nil {
		t.Errorf("compose.yaml relayd overrides the image's command (%v %v): it should need env only", relayd.Entrypoint, relayd.Command)
	}
	required := configVars(t, func(opts string) bool { return strings.Contains(opts, "required") })
	if len(required) == 0 {
		t.Fatal("found no required RELAY_* variable in cmd/relayd/config.go")
	}
	for name := range required {
		if relayd.Environment[name] == "" {
			t.Errorf("compose.yaml relayd environment lacks %s, which relayd requires", name)
		}
	}
}

// The build context leaves out history and build output, and keeps what
// the build needs.
func TestDockerignore(t *testing.T) {
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.SplitSeq(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/"))
		}
	}
	for _, want := range []string{".git", "bin"} {
		if !slices.Contains(patterns, want) {
			t.Errorf(".dockerignore %v: want %s left out", patterns, want)
		}
	}
	for _, need := range []string{"go.mod", "go.sum", "cmd", "schema", "*", "*.go", "**/*.go", "**/*.sql"} {
		if slices.Contains(patterns, need) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", need)
		}
	}
}

// configVars returns the RELAY_* variables of cmd/relayd's config struct
// (package main: read from source) whose env tag options match, with their
// defaults.
func configVars(t *testing.T, match func(opts string) bool) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../cmd/relayd/config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		field, ok := n.(*ast.Field)
		if !ok {
			return true
		}
		if name, opts, def, ok := testenv.EnvTag(field); ok && match(opts) {
			vars[name] = def
		}
		return true
	})
	return vars
}
