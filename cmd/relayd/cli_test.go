package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/backfill"
	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/replay"
	"github.com/relayd/relayd/internal/verify"
	"github.com/relayd/relayd/relay"
)

// runCLI runs relayd with args in env (nil: an empty environment).
func runCLI(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut, envconfig.MapLookuper(env))
	return code, out.String(), errOut.String()
}

// helps is every help text relayd prints, by the arguments that print it.
var helps = [][]string{
	{"--help"}, {"run", "--help"}, {"migrate", "--help"}, {"status", "--help"},
	{"backfill", "--help"}, {"cutover", "check", "--help"}, {"verify", "--help"},
	{"outbox", "--help"}, {"outbox", "parked", "--help"}, {"outbox", "retry", "--help"},
	{"version", "--help"}, {"tail", "--help"}, {"phase", "--help"}, {"phase", "set", "--help"}, {"replay", "--help"},
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, out, _ := runCLI(t, nil, args...)
		if want := "relayd " + version + " (" + runtime.Version() + ")\n"; code != exitOK || out != want {
			t.Errorf("relayd %v: exit %d, %q; want 0 and %q", args, code, out, want)
		}
	}
	code, out, errOut := runCLI(t, nil, "version", "--json")
	var v struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != exitOK || v.Version != version || v.GoVersion != runtime.Version() {
		t.Errorf("version --json: exit %d, %q (%v), stderr %q", code, out, err, errOut)
	}
}

// GOMAXPROCS is checked once a command is about to work, so that a bad
// value does not stand between an operator and the help; the work itself
// still refuses it as a config error, on one line.
func TestBadGOMAXPROCSLeavesHelpAlone(t *testing.T) {
	env := with(base(), "GOMAXPROCS", "two")
	for _, args := range append(helps, []string{"version"}, []string{"--version"}) {
		if code, out, errOut := runCLI(t, env, args...); code != exitOK || out == "" || errOut != "" {
			t.Errorf("GOMAXPROCS=two relayd %v: exit %d, stderr %q; want 0 and the help", args, code, errOut)
		}
	}
	for _, args := range [][]string{{"run"}, {"status"}, {"migrate"}, {"outbox", "parked"}} {
		code, _, errOut := runCLI(t, env, args...)
		if code != exitUsage || !strings.HasPrefix(errOut, "relayd: config: GOMAXPROCS: ") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("GOMAXPROCS=two relayd %v: exit %d, stderr %q; want 2 and one line naming GOMAXPROCS", args, code, errOut)
		}
	}
}

// Every help writes its flags --flag, never -flag, and every --flag it
// shows is one the command accepts.
func TestHelpShowsDoubleDashFlags(t *testing.T) {
	single := regexp.MustCompile(`(^|[\s\[(|,])-[a-zA-Z]`)
	double := regexp.MustCompile(`--[a-z][a-z-]*`)
	for _, args := range helps {
		code, out, _ := runCLI(t, nil, args...)
		if code != exitOK {
			t.Fatalf("relayd %v: exit %d", args, code)
		}
		for line := range strings.Lines(out) {
			if single.MatchString(line) {
				t.Errorf("relayd %v: a single-dash flag in %q", args, line)
			}
		}
		cmd := args[:len(args)-1]
		if len(cmd) == 0 || len(cmd) == 1 && cmd[0] == "outbox" {
			continue // these list other commands' flags
		}
		for _, f := range double.FindAllString(out, -1) {
			if f == "--help" || f == "--version" {
				continue // relayd's own
			}
			// A value flag takes "1" and the sentinel stops the command;
			// a bool flag leaves "1" a refused argument. Either way it
			// connects to nothing, and an unknown f says "not defined".
			_, _, errOut := runCLI(t, base(), append(append([]string{}, cmd...), f, "1", "--sentinel")...)
			if strings.Contains(errOut, "not defined: "+f) {
				t.Errorf("relayd %v shows %s, which it does not accept: %s", args, f, errOut)
			}
		}
	}
}

// A flag another command (or another outbox subcommand) takes is refused,
// and every usage error ends by pointing at the command's --help.
func TestBadFlagsPointToHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--bogus"}, "not defined: --bogus"},
		{[]string{"migrate", "--bogus"}, "not defined: --bogus"},
		{[]string{"status", "--bogus"}, "not defined: --bogus"},
		{[]string{"backfill", "--bogus"}, "not defined: --bogus"},
		{[]string{"cutover", "check", "--bogus"}, "not defined: --bogus"},
		{[]string{"verify", "--bogus"}, "not defined: --bogus"},
		{[]string{"replay", "--bogus"}, "not defined: --bogus"},
		{[]string{"version", "--bogus"}, "not defined: --bogus"},
		{[]string{"outbox", "parked", "--bogus"}, "not defined: --bogus"},
		{[]string{"outbox", "retry", "--bogus"}, "not defined: --bogus"},
		{[]string{"phase", "--bogus"}, "not defined: --bogus"},
		{[]string{"phase", "set", "dual", "--bogus"}, "not defined: --bogus"},
		{[]string{"phase", "--reason", "x"}, "not defined: --reason"},
		// Each subcommand has its own flags.
		{[]string{"outbox", "retry", "--all", "--limit", "5"}, "not defined: --limit"},
		{[]string{"outbox", "parked", "--all"}, "not defined: --all"},
		{[]string{"outbox", "parked", "--id", "1"}, "not defined: --id"},
		{[]string{"status", "--limit", "5"}, "not defined: --limit"},
		{[]string{"verify", "--consumer", "c"}, "not defined: --consumer"},
		// Go's flag package takes -flag too; the messages write --flag.
		{[]string{"status", "-bogus"}, "not defined: --bogus"},
		{[]string{"outbox", "parked", "--limit", "many"}, `invalid value "many" for flag --limit`},
		{[]string{"status", "--json=maybe"}, `invalid boolean value "maybe" for --json`},
		{[]string{"verify", "--since"}, "flag needs an argument: --since"},
	} {
		code, out, errOut := runCLI(t, base(), tc.args...)
		if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 ||
			!strings.Contains(errOut, tc.want) || !strings.HasSuffix(errOut, " --help)\n") {
			t.Errorf("relayd %v: exit %d, stderr %q; want 2 and one line with %q, ending with a pointer to --help", tc.args, code, errOut, tc.want)
		}
	}
	for _, args := range [][]string{{"--bogus"}, {"outbox", "frobnicate"}, {"cutover", "frobnicate"}} {
		if code, _, errOut := runCLI(t, base(), args...); code != exitUsage || !strings.Contains(errOut, "--help") {
			t.Errorf("relayd %v: exit %d, stderr %q; want 2 and a pointer to --help", args, code, errOut)
		}
	}
}

// No command takes an argument it would ignore: each is refused with exit
// 2, before anything is connected (base's database does not exist).
func TestStrayArgumentsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"run", "now"}, {"status", "amqp"}, {"status", "--json", "extra"},
		{"backfill", "--queue", "q", "extra"}, {"cutover", "check", "--consumer", "c", "extra"},
		{"verify", "extra"}, {"outbox", "parked", "extra"}, {"outbox", "retry", "--all", "extra"},
		{"version", "extra"}, {"migrate", "up", "extra"}, {"help", "extra"}, {"tail", "extra"}, {"replay", "extra"},
		{"phase", "show", "extra"}, {"phase", "set", "dual", "extra"},
	} {
		code, out, errOut := runCLI(t, base(), args...)
		want := `unexpected argument "` + args[len(args)-1] + `"`
		if code != exitUsage || out != "" || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("relayd %v: exit %d, stderr %q; want 2 and one line with %s", args, code, errOut, want)
		}
	}
}

// The top-level usage lines its descriptions up in one column.
func TestUsageAligned(t *testing.T) {
	_, out, _ := runCLI(t, nil, "--help")
	col, lines := -1, 0
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, "  relayd ") {
			continue
		}
		lines++
		rest := strings.TrimPrefix(line, "  relayd ")
		gap := strings.Index(rest, "  ")
		if gap < 0 {
			t.Errorf("no description: %q", line)
			continue
		}
		i := len(line) - len(rest) + gap + len(rest[gap:]) - len(strings.TrimLeft(rest[gap:], " "))
		if col == -1 {
			col = i
		}
		if i != col {
			t.Errorf("description at column %d, want %d: %q", i, col, line)
		}
	}
	if lines < len(commands) {
		t.Errorf("%d command lines in the usage, want %d:\n%s", lines, len(commands), out)
	}
}

// Every command's JSON has one unit convention: durations are float seconds
// in fields named *_seconds (never a Go duration in nanoseconds), times are
// RFC 3339 strings. Checked on the types the commands print.
func TestJSONUnits(t *testing.T) {
	durType := reflect.TypeFor[time.Duration]()
	var walk func(path string, typ reflect.Type)
	walk = func(path string, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ == reflect.TypeFor[time.Time]() {
			return
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if tag == "-" || !f.IsExported() {
				continue
			}
			if f.Type == durType {
				t.Errorf("%s.%s: a time.Duration in JSON (nanoseconds): want float seconds in a *_seconds field", path, f.Name)
			}
			for _, unit := range []string{"_ns", "_ms", "_us", "_millis", "_nanos"} {
				if strings.HasSuffix(tag, unit) {
					t.Errorf("%s.%s: JSON field %q: want seconds, named *_seconds", path, f.Name, tag)
				}
			}
			walk(path+"."+f.Name, f.Type)
		}
	}
	for _, v := range []any{relay.TargetStats{}, relay.ParkedRow{}, backfill.Summary{}, cutover.Result{}, verify.Report{}, migrationJSON{}, phaseState{}, replay.Summary{}} {
		walk(reflect.TypeOf(v).String(), reflect.TypeOf(v))
	}
	// And the figures are there, in seconds.
	b, _ := json.Marshal(backfill.Summary{Duration: 1500 * time.Millisecond, DurationSeconds: 1.5})
	if !strings.Contains(string(b), `"duration_seconds":1.5`) {
		t.Errorf("backfill summary: %s", b)
	}
}

// backfill does not listen on RELAY_METRICS_ADDR, where a relayd on the same
// host does: it has its own --metrics-addr (RELAY_BACKFILL_METRICS_ADDR),
// off unless set.
func TestBackfillMetricsAddrIsItsOwn(t *testing.T) {
	code, out, _ := runCLI(t, with(base(), "RELAY_METRICS_ADDR", "127.0.0.1:9090"), "backfill", "--help")
	i := strings.Index(out, "  --metrics-addr string\n")
	if code != exitOK || i < 0 || strings.Contains(strings.SplitN(out[i:], "\n", 3)[1], "(default") {
		t.Fatalf("backfill --help: exit %d, want --metrics-addr without a default:\n%s", code, out)
	}
	code, _, errOut := runCLI(t, base(), "backfill", "--queue", "q", "--metrics-addr", "nowhere")
	if code != exitUsage || !strings.HasPrefix(errOut, "relayd backfill: --metrics-addr (or RELAY_BACKFILL_METRICS_ADDR): ") {
		t.Errorf("bad --metrics-addr: exit %d, %q", code, errOut)
	}
}

// The one-shot commands' --connect-timeout must be a positive duration.
func TestConnectTimeoutFlag(t *testing.T) {
	for _, args := range [][]string{
		{"status", "--connect-timeout", "0s"}, {"outbox", "parked", "--connect-timeout", "-1s"},
		{"outbox", "retry", "--all", "--connect-timeout", "0s"}, {"verify", "--connect-timeout", "0s"},
		{"cutover", "check", "--consumer", "c", "--connect-timeout", "0s"},
		{"phase", "--connect-timeout", "0s"}, {"phase", "set", "amqp", "--connect-timeout", "0s"},
	} {
		if code, _, errOut := runCLI(t, base(), args...); code != exitUsage || !strings.Contains(errOut, "--connect-timeout must be a positive duration") {
			t.Errorf("relayd %v: exit %d, %q", args, code, errOut)
		}
	}
}
