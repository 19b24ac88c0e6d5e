package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/testenv"
)

// cliCase is a command (and its action) as the CLI tests run it.
type cliCase struct {
	cmd, action string
	rest        []string // what the command needs besides: the phase, a required flag
	flag        []string // one of its single-valued flags, with a value it takes (nil: it has none)
	bad         []string // one of its flags with a value it refuses before connecting...
	refusal     string   // ...and the refusal
	noConfig    bool     // it reads no configuration (version)
}

// everyCommand is every command and action relayd accepts, for the tests
// that run each: the flags may stand before or after the action, a flag is
// given once, an unknown flag and a bad variable are refused. None of them
// connects: each stops at a usage or configuration error first.
var everyCommand = []cliCase{
	{cmd: "run"},
	{cmd: "migrate", action: "up", flag: []string{"--json"}, bad: []string{"--inbox", "Bad-Name"}, refusal: `--inbox "Bad-Name" is not a valid table name`},
	{cmd: "migrate", action: "status", flag: []string{"--json"}, bad: []string{"--inbox", "Bad-Name"}, refusal: `--inbox "Bad-Name" is not a valid table name`},
	{cmd: "migrate", action: "down-to", rest: []string{"12"}, flag: []string{"--json"}, bad: []string{"--inbox", "t"}, refusal: "down-to is for the outbox only"},
	{cmd: "status", flag: []string{"--targets", "amqp"}, bad: []string{"--targets", "sqs"}, refusal: "--targets"},
	{cmd: "phase", action: "show", flag: []string{"--history"}, bad: []string{"--connect-timeout", "0s"}, refusal: "--connect-timeout must be a positive duration"},
	{cmd: "phase", action: "set", rest: []string{"dual"}, flag: []string{"--reason", "why"}, bad: []string{"--connect-timeout", "0s"}, refusal: "--connect-timeout must be a positive duration"},
	{cmd: "backfill", rest: []string{"--queue", "q"}, flag: []string{"--dry-run"}, bad: []string{"--prefetch", "70000"}, refusal: "--prefetch (or RELAY_BACKFILL_PREFETCH): 70000 is out of range"},
	{cmd: "replay", flag: []string{"--dry-run"}, bad: []string{"--rate", "0"}, refusal: "--rate 0 is out of range"},
	{cmd: "cutover", action: "check", rest: []string{"--consumer", "c"}, flag: []string{"--wait"}, bad: []string{"--connect-timeout", "0s"}, refusal: "--connect-timeout must be a positive duration"},
	{cmd: "verify", flag: []string{"--json"}, bad: []string{"--examples", "-1"}, refusal: "--examples must be 0 or more"},
	{cmd: "outbox", action: "parked", flag: []string{"--json"}, bad: []string{"--limit", "0"}, refusal: "--limit must be positive"},
	{cmd: "outbox", action: "retry", rest: []string{"--all"}, flag: []string{"--json"}, bad: []string{"--target", "sqs"}, refusal: "--target: want amqp or nats"},
	{cmd: "tail", flag: []string{"--json"}, bad: []string{"--connect-timeout", "0s"}, refusal: "--connect-timeout must be a positive duration"},
	{cmd: "routes", action: "check", flag: []string{"--json"}, bad: []string{"--connect-timeout", "0s"}, refusal: "--connect-timeout must be a positive duration"},
	{cmd: "version", flag: []string{"--json"}, bad: []string{"--json=maybe"}, refusal: `invalid boolean value "maybe" for --json`, noConfig: true},
}

// placements are the ways of giving flags f to a command: before its
// action, between the action and what follows it, and last.
func placements(cmd, action string, rest, f []string) [][]string {
	cat := func(parts ...[]string) []string { return slices.Concat(append([][]string{{cmd}}, parts...)...) }
	if action == "" {
		return [][]string{cat(f, rest), cat(rest, f)}
	}
	a := []string{action}
	if len(rest) == 0 {
		return [][]string{cat(f, a), cat(a, f)}
	}
	return [][]string{cat(f, a, rest), cat(a, f, rest), cat(a, rest, f)}
}

// The table covers every command and action the dispatcher accepts.
func TestEveryCommandCovered(t *testing.T) {
	for name := range dispatch {
		if name == "help" {
			continue
		}
		for _, action := range append([]string{""}, actions[name]...) {
			if action == "" && len(actions[name]) > 0 {
				continue
			}
			if !slices.ContainsFunc(everyCommand, func(c cliCase) bool { return c.cmd == name && c.action == action }) {
				t.Errorf("relayd %s %s is not in everyCommand", name, action)
			}
		}
	}
}

// A flag works the same before the action, after it, and after what
// follows it: its value reaches the command's checks (refused there alike),
// and a good value lets the command go on to its configuration (refused
// there alike, for a bad RELAY_PPROF).
func TestFlagsBeforeOrAfterTheAction(t *testing.T) {
	badEnv := with(base(), "RELAY_PPROF", "yes")
	for _, c := range everyCommand {
		if c.flag == nil {
			continue
		}
		for _, args := range placements(c.cmd, c.action, c.rest, c.bad) {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := runCLI(t, base(), args...)
				if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, c.refusal) {
					t.Errorf("exit %d, stdout %q, stderr %q; want 2 and one line with %q", code, out, errOut, c.refusal)
				}
			})
		}
		for _, args := range placements(c.cmd, c.action, c.rest, c.flag) {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := runCLI(t, badEnv, args...)
				if c.noConfig {
					if code != exitOK || errOut != "" {
						t.Errorf("exit %d, stderr %q; want 0", code, errOut)
					}
					return
				}
				if want := "relayd: config: RELAY_PPROF=\"yes\": want true or false\n"; code != exitUsage || out != "" || errOut != want {
					t.Errorf("exit %d, stdout %q, stderr %q; want 2 and %q", code, out, errOut, want)
				}
			})
		}
	}
}

// A single-valued flag given twice is refused, naming it, wherever each
// stands: "the last one wins" would silently drop the first.
func TestRepeatedFlagRefused(t *testing.T) {
	for _, c := range everyCommand {
		if c.flag == nil {
			continue
		}
		for _, args := range placements(c.cmd, c.action, append(slices.Clone(c.rest), c.flag...), c.flag) {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := runCLI(t, base(), args...)
				want := c.flag[0] + " given twice"
				if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, want) || !strings.HasSuffix(errOut, " --help)\n") {
					t.Errorf("exit %d, stdout %q, stderr %q; want 2 and one line with %q, pointing to --help", code, out, errOut, want)
				}
			})
		}
	}
}

// An unknown flag is refused, naming it, wherever it stands.
func TestUnknownFlagRefused(t *testing.T) {
	for _, c := range everyCommand {
		for _, args := range placements(c.cmd, c.action, c.rest, []string{"--bogus"}) {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := runCLI(t, base(), args...)
				if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "not defined: --bogus") {
					t.Errorf("exit %d, stdout %q, stderr %q; want 2 and one line naming --bogus", code, out, errOut)
				}
			})
		}
	}
}

// A bad boolean in the environment is refused by every command that reads
// the configuration: exit 2, one line with the variable, its value and
// what it accepts. backfill's own RELAY_BACKFILL_* variables too.
func TestBadBooleanVariable(t *testing.T) {
	for _, c := range everyCommand {
		if c.noConfig {
			continue
		}
		vars := []string{"RELAY_PPROF", "RELAY_SKIP_PARKED_KEYS"}
		if c.cmd == "backfill" {
			vars = append(vars, "RELAY_BACKFILL_DRY_RUN", "RELAY_BACKFILL_FOLLOW")
		}
		for _, v := range vars {
			args := placements(c.cmd, c.action, c.rest, nil)[0]
			t.Run(v+" "+strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := runCLI(t, with(base(), v, "yes"), args...)
				if want := "relayd: config: " + v + "=\"yes\": want true or false\n"; code != exitUsage || out != "" || errOut != want {
					t.Errorf("exit %d, stdout %q, stderr %q; want 2 and %q", code, out, errOut, want)
				}
			})
		}
	}
}

// Every variable relayd parses as a bool, a number or a duration — of the
// relay's configuration and of backfill's — names itself, its value and
// what it accepts when it cannot be parsed.
func TestVariableParseErrors(t *testing.T) {
	for _, set := range []struct {
		typ  reflect.Type
		load func(t *testing.T, env map[string]string) string
	}{
		{reflect.TypeFor[config](), func(_ *testing.T, env map[string]string) string {
			_, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
			return fmt.Sprint(err)
		}},
		{reflect.TypeFor[backfillEnv](), func(t *testing.T, env map[string]string) string {
			_, _, errOut := runCLI(t, env, "backfill", "--queue", "q")
			return strings.TrimPrefix(strings.TrimSuffix(errOut, "\n"), "relayd: config: ")
		}},
	} {
		for i := range set.typ.NumField() {
			f := set.typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			want := accepts(f.Type)
			if name == "" || want == "" {
				continue
			}
			t.Run(name, func(t *testing.T) {
				got := set.load(t, with(base(), name, "nope"))
				if w := name + `="nope": want ` + want; got != w {
					t.Errorf("%s=nope: %q, want %q", name, got, w)
				}
			})
		}
	}
	for typ, want := range map[reflect.Type]string{
		reflect.TypeFor[bool](): "true or false", reflect.TypeFor[int](): "a whole number", reflect.TypeFor[int64](): "a whole number",
		reflect.TypeFor[float64](): "a number, like 2.5", reflect.TypeFor[string](): "",
	} {
		if got := accepts(typ); got != want {
			t.Errorf("accepts(%s) = %q, want %q", typ, got, want)
		}
	}
}

// The top-level usage lists every command the dispatcher accepts and every
// action of each; each action listed is one the command accepts, and the
// command refuses any other.
func TestUsageListsEveryCommand(t *testing.T) {
	synopses := map[string][]string{} // command: its usage lines' synopses
	for line := range strings.Lines(usage) {
		rest, ok := strings.CutPrefix(line, "  relayd ")
		if !ok {
			continue
		}
		synopsis, _, _ := strings.Cut(rest, "  ")
		name, _, _ := strings.Cut(synopsis, " ")
		synopses[name] = append(synopses[name], synopsis)
	}
	for name := range dispatch {
		if synopses[name] == nil {
			t.Errorf("relayd %s is not in the usage:\n%s", name, usage)
		}
	}
	for alias := range aliases {
		if strings.HasPrefix(alias, "--") && !strings.Contains(usage, alias) {
			t.Errorf("%s is not in the usage", alias)
		}
	}
	for name, acts := range actions {
		for _, a := range acts {
			word := regexp.MustCompile(`(^|[ \[|])` + regexp.QuoteMeta(a) + `($|[ \]|])`)
			if !slices.ContainsFunc(synopses[name], word.MatchString) {
				t.Errorf("relayd %s %s is not in the usage: %q", name, a, synopses[name])
			}
		}
	}
	// Accepted: the command goes on to its configuration, refused there.
	badEnv := map[string]string{"RELAY_PPROF": "yes"}
	for _, c := range everyCommand {
		if c.noConfig {
			continue
		}
		args := placements(c.cmd, c.action, c.rest, nil)[0]
		if code, _, errOut := runCLI(t, badEnv, args...); code != exitUsage || !strings.HasPrefix(errOut, "relayd: config: ") {
			t.Errorf("relayd %v: exit %d, %q; want it accepted, up to its configuration", args, code, errOut)
		}
	}
	for name := range actions {
		if code, out, errOut := runCLI(t, badEnv, name, "frobnicate"); code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "config:") {
			t.Errorf("relayd %s frobnicate: exit %d, %q; want 2 and one line refusing it", name, code, errOut)
		}
	}
}

// Every help has one shape: the usage, what the command does, then
// "Flags:" and the flags as withFlagDefaults lists them (or, for a
// command without flags of its own, "Flags:" and why not).
func TestHelpFormat(t *testing.T) {
	entry := regexp.MustCompile(`^  --[a-z][a-z-]*( \S+)?$`)
	all := slices.Clone(helps)
	for _, c := range everyCommand {
		all = append(all, placements(c.cmd, c.action, nil, []string{"--help"})...)
	}
	for _, args := range all {
		if len(args) == 1 {
			continue // the top-level usage
		}
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, _ := runCLI(t, nil, args...)
			if code != exitOK || !strings.HasPrefix(out, "Usage:") {
				t.Fatalf("exit %d, want 0 and the usage first:\n%s", code, out)
			}
			_, flags, ok := strings.Cut(out, "\nFlags:")
			if !ok {
				t.Fatalf("no Flags: line:\n%s", out)
			}
			if !strings.HasPrefix(flags, "\n") {
				return // "Flags: none..." and the like, its last paragraph
			}
			lines := strings.Split(strings.TrimSuffix(flags[1:], "\n"), "\n")
			if !entry.MatchString(lines[0]) {
				t.Errorf("Flags: followed by %q, not a flag", lines[0])
			}
			for _, l := range lines {
				if !entry.MatchString(l) && !strings.HasPrefix(l, "    \t") {
					t.Errorf("not withFlagDefaults' form: %q", l)
				}
			}
		})
	}
}

// phase finds its action with phase set's flags: the set must be phase
// set's own.
func TestPhaseSetFlagsMatch(t *testing.T) {
	fs, _ := newPhaseSetFlags(&phaseSetArgs{})
	_, out, _ := runCLI(t, nil, "phase", "set", "--help")
	if want := withFlagDefaults(fs, phaseSetHelp); out != want {
		t.Errorf("phase set --help differs from newPhaseSetFlags':\n%s\nwant\n%s", out, want)
	}
}

// scanArgs reads a flag and its value as the flag package does, and goes on
// past positional arguments.
func TestScanArgs(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Bool("json", false, "")
	fs.String("inbox", "", "")
	for _, tc := range []struct {
		args       []string
		flags, pos []string
	}{
		{[]string{"status", "--json"}, []string{"--json"}, []string{"status"}},
		{[]string{"--inbox", "status", "up"}, []string{"--inbox", "status"}, []string{"up"}},
		{[]string{"--inbox=t", "status", "-json"}, []string{"--inbox=t", "-json"}, []string{"status"}},
		{[]string{"--json", "false"}, []string{"--json"}, []string{"false"}}, // a bool takes no separate value
		{[]string{"--inbox", "--json"}, []string{"--inbox", "--json"}, nil},  // a value may look like a flag
		{[]string{"--inbox"}, []string{"--inbox"}, nil},                      // missing: Parse says so
		{[]string{"--bogus", "x"}, []string{"--bogus"}, []string{"x"}},       // unknown: Parse refuses it
		{[]string{"up", "--", "--json", "-"}, nil, []string{"up", "--json", "-"}},
		{[]string{"-", "--json"}, []string{"--json"}, []string{"-"}},
	} {
		flags, pos := splitArgs(tc.args, fs)
		if !slices.Equal(flags, tc.flags) || !slices.Equal(pos, tc.pos) {
			t.Errorf("splitArgs(%q) = %q, %q; want %q, %q", tc.args, flags, pos, tc.flags, tc.pos)
		}
	}
	for _, tc := range []struct {
		args         []string
		action, rest string
	}{
		{[]string{"--inbox", "status", "up", "--json"}, "up", "--inbox status --json"},
		{[]string{"--json", "status"}, "status", "--json"},
		{[]string{"--json"}, "", "--json"},
		{nil, "", ""},
	} {
		action, rest := takeAction(tc.args, fs)
		if action != tc.action || strings.Join(rest, " ") != tc.rest {
			t.Errorf("takeAction(%q) = %q, %q; want %q, %q", tc.args, action, rest, tc.action, tc.rest)
		}
	}
}

// listValue is a flag meant to repeat.
type listValue []string

func (l *listValue) String() string     { return strings.Join(*l, ",") }
func (l *listValue) Set(s string) error { *l = append(*l, s); return nil }
func (l *listValue) IsList() bool       { return true }

// A flag meant as a list may repeat; every other flag, the flag package's
// or a Value of relayd's own, may not.
func TestListFlagsRepeat(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--each", "a", "--each", "b"}, exitOK},
		{[]string{"--one", "a", "--one", "b"}, exitUsage},
		{[]string{"--n", "1", "--n", "1"}, exitUsage},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var each listValue
		fs.Var(&each, "each", "")
		fs.Func("one", "", func(string) error { return nil })
		fs.Int("n", 0, "")
		var stdout, stderr strings.Builder
		code := (&cli{stdout: &stdout, stderr: &stderr}).exitCode(parseFlags(fs, tc.args))
		if code != tc.code {
			t.Errorf("%q: exit %d (%s), want %d", tc.args, code, stderr.String(), tc.code)
		}
		if tc.code == exitOK && each.String() != "a,b" {
			t.Errorf("%q: --each %q, want a,b", tc.args, each.String())
		}
	}
}

// Against a real outbox, --json before the action and after it print the
// same document (relayd migrate status --json once refused --json).
func TestJSONEitherSideOfTheAction(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	env := map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_OUTBOX_TABLE": table.String()}
	for _, c := range [][2]string{{"migrate", "status"}, {"phase", "show"}, {"outbox", "parked"}} {
		before := mustRun(t, env, c[0], "--json", c[1])
		after := mustRun(t, env, c[0], c[1], "--json")
		if !json.Valid([]byte(before)) || before != after {
			t.Errorf("relayd %s --json %s:\n%s\nrelayd %s %s --json:\n%s", c[0], c[1], before, c[0], c[1], after)
		}
	}
}
