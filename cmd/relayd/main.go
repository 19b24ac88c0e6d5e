// Command relayd relays committed outbox rows from Postgres to RabbitMQ and
// NATS JetStream. This package only reads the environment and flags, wires
// the packages together and maps failures to exit codes: 0 done, 1 failed,
// 2 bad configuration or usage: each command returns an error, and
// exitCode (command.go) maps it, in one place.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/sethvargo/go-envconfig"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// registry is every command relayd accepts, in the order of the top-level
// usage: its name, its lines there (a synopsis and what it does; one per
// action that needs its own) and how to make it. The usage, dispatch and
// relayd help are built from it; each command's --help is its Usage.
var registry = []struct {
	name  string
	lines [][2]string
	new   func(*cli) command
}{
	{"run", [][2]string{{"run", "relay until SIGINT/SIGTERM (a second signal exits at once)"}},
		func(c *cli) command { return &runCommand{cli: c} }},
	{"migrate", [][2]string{
		{"migrate [up|status] [--inbox TABLE]", "create or upgrade the outbox table, or with --inbox a consumer's inbox table (status: list its migrations)"},
		{"migrate down-to N", "undo the outbox's migrations after N, for a relayd of an earlier release"},
	}, func(c *cli) command { return &migrateCommand{cli: c} }},
	{"status", [][2]string{{"status [--check]", "how far behind each target is, the phase and the running relays (--check: exit 1 past --max-lag or --max-parked)"}},
		func(c *cli) command { return &statusCommand{cli: c} }},
	{"phase", [][2]string{
		{"phase [show]", "the migration phase the relays share, and the phase each running relay runs"},
		{"phase set amqp|dual|nats", "set the phase (into nats only once the cutover check holds)"},
	}, func(c *cli) command { return &phaseCommand{cli: c} }},
	{"backfill", [][2]string{{"backfill", "move a legacy RabbitMQ queue into the JetStream stream, exactly once"}},
		func(c *cli) command { return &backfillCommand{cli: c} }},
	{"replay", [][2]string{{"replay", "roll back: publish to the legacy exchange what the stream got while RabbitMQ did not"}},
		func(c *cli) command { return &replayCommand{cli: c} }},
	{"cutover", [][2]string{{"cutover check", "may these consumer groups read JetStream only? (--dual-read, --rolling-upgrade)"}},
		func(c *cli) command { return &cutoverCommand{cli: c} }},
	{"verify", [][2]string{{"verify", "check the stream against the outbox's record (exit 1 if anything is missing or duplicated)"}},
		func(c *cli) command { return &verifyCommand{cli: c} }},
	{"outbox", [][2]string{
		{"outbox parked", "list parked rows"},
		{"outbox retry", "put parked rows back in line"},
	}, func(c *cli) command { return &outboxCommand{cli: c} }},
	{"tail", [][2]string{{"tail", "print each message reaching the stream and the exchange, until Ctrl-C"}},
		func(c *cli) command { return &tailCommand{cli: c} }},
	{"routes", [][2]string{{"routes check", "list the routes (RELAY_ROUTES) and check their exchanges and streams exist"}},
		func(c *cli) command { return &routesCommand{cli: c} }},
	{"version", [][2]string{{"version", "print the version (also --version)"}},
		func(c *cli) command { return &versionCommand{cli: c} }},
	{"help", [][2]string{{"help [COMMAND [ACTION]]", "print this list (also --help), or a command's help (as COMMAND --help)"}},
		func(c *cli) command { return &helpCommand{cli: c} }},
}

// commands lists the top-level usage, one line per command or action (the
// usage aligns them). TestUsageListsEveryCommand holds it to dispatch and
// actions.
var commands = func() []struct{ name, what string } {
	var out []struct{ name, what string }
	for _, r := range registry {
		for _, l := range r.lines {
			out = append(out, struct{ name, what string }{l[0], l[1]})
		}
	}
	return out
}()

// usage is the top-level help, its columns aligned by tabwriter.
var usage = func() string {
	var b strings.Builder
	b.WriteString("relayd relays outbox rows from Postgres to RabbitMQ and NATS JetStream.\n\nUsage:\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  relayd %s\t%s\n", c.name, c.what)
	}
	tw.Flush()
	b.WriteString(`
Each command takes --help; every flag is written --flag, before or after
the action. Commands that report take --json. Configuration comes from
RELAY_* environment variables; see docs/configuration.md for the full table.
`)
	return b.String()
}()

// dispatch is every command relayd accepts, by name; aliases maps the
// other spellings of some.
var dispatch = func() map[string]func(*cli) command {
	m := map[string]func(*cli) command{}
	for _, r := range registry {
		m[r.name] = r.new
	}
	return m
}()

// aliases are the flag-like spellings of version and help.
var aliases = map[string]string{"-version": "version", "--version": "version", "-h": "help", "-help": "help", "--help": "help"}

// actions are the actions of the commands that take one, the default (when
// none is given) first; each command accepts these and no others.
var actions = map[string][]string{
	"migrate": {"up", "status", "down-to"},
	"phase":   {"show", "set"},
	"outbox":  {"parked", "retry"},
	"routes":  {"check"},
	"cutover": {"check"},
}

// isAction says whether a is one of cmd's actions.
func isAction(cmd, a string) bool {
	return slices.Contains(actions[cmd], a)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, envconfig.OsLookuper()))
}

// run is main without the process: testable with arguments, writers and an
// environment of the test's choosing. It returns the exit status.
func run(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	c := &cli{stdout: stdout, stderr: stderr, env: env}
	top := &relaydCommand{cli: c}
	return c.exitCode(within("", top, top.Run(context.Background(), args)))
}

// relaydCommand is relayd itself: it runs the command args name.
type relaydCommand struct{ *cli }

func (r *relaydCommand) Usage() string { return usage }

func (r *relaydCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errNoAction
	}
	name := args[0]
	if a, ok := aliases[name]; ok {
		name = a
	}
	if newCommand, ok := dispatch[name]; ok {
		cmd := newCommand(r.cli)
		return within(name, cmd, cmd.Run(ctx, args[1:]))
	}
	if strings.HasPrefix(name, "-") {
		return usagef("unknown flag %s (see relayd --help)", name)
	}
	return usagef("unknown command %q\n\n%s", name, usage)
}

// helpCommand prints the top-level usage, or a command's help: the same
// Usage its --help prints.
type helpCommand struct{ *cli }

func (h *helpCommand) Usage() string { return usage }

func (h *helpCommand) Run(_ context.Context, args []string) error {
	if len(args) == 1 && aliases[args[0]] == "help" {
		args = nil // relayd help --help
	}
	if len(args) == 0 {
		return flag.ErrHelp
	}
	newCommand, ok := dispatch[args[0]]
	if !ok || len(args) > 2 {
		return within("", nil, usagef("unexpected argument %q: for a command's help, relayd help COMMAND or relayd COMMAND --help", args[len(args)-1]))
	}
	name, cmd := args[0], newCommand(h.cli)
	if len(args) == 2 {
		wa, ok := cmd.(withActions)
		var sub command
		if ok {
			sub, ok = wa.action(args[1])
		}
		switch {
		case ok:
			name, cmd = name+" "+args[1], sub
		case !isAction(name, args[1]): // migrate's actions share its help
			return within("", nil, usagef("unexpected argument %q: relayd %s has no such action (see relayd %s --help)", args[1], name, name))
		}
	}
	return within(name, cmd, flag.ErrHelp)
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// signalContext is cancelled by the first SIGINT/SIGTERM; a second one
// exits the process at once with status 1.
func signalContext(parent context.Context, log *slog.Logger) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Info("stopping: finishing in-flight batches (signal again to exit now)", "signal", s.String())
		cancel()
		s = <-sigs
		log.Warn("second signal: exiting now", "signal", s.String())
		os.Exit(exitFailure)
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}
