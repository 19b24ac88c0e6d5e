// Command relayd relays committed outbox rows from Postgres to RabbitMQ and
// NATS JetStream. This package only reads the environment and flags, wires
// the packages together and maps failures to exit codes: 0 done, 1 failed,
// 2 bad configuration or usage.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
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

// commands lists the top-level usage, one line per command or action (the
// usage aligns them). TestUsageListsEveryCommand holds it to dispatch and
// actions.
var commands = []struct{ name, what string }{
	{"run", "relay until SIGINT/SIGTERM (a second signal exits at once)"},
	{"migrate [up|status] [--inbox TABLE]", "create or upgrade the outbox table, or with --inbox a consumer's inbox table (status: list its migrations)"},
	{"migrate down-to N", "undo the outbox's migrations after N, for a relayd of an earlier release"},
	{"status [--check]", "how far behind each target is, the phase and the running relays (--check: exit 1 past --max-lag or --max-parked)"},
	{"phase [show]", "the migration phase the relays share, and the phase each running relay runs"},
	{"phase set amqp|dual|nats", "set the phase (into nats only once the cutover check holds)"},
	{"backfill", "move a legacy RabbitMQ queue into the JetStream stream, exactly once"},
	{"replay", "roll back: publish to the legacy exchange what the stream got while RabbitMQ did not"},
	{"cutover check", "may these consumer groups read JetStream only? (--dual-read, --rolling-upgrade)"},
	{"verify", "check the stream against the outbox's record (exit 1 if anything is missing or duplicated)"},
	{"outbox parked", "list parked rows"},
	{"outbox retry", "put parked rows back in line"},
	{"tail", "print each message reaching the stream and the exchange, until Ctrl-C"},
	{"routes check", "list the routes (RELAY_ROUTES) and check their exchanges and streams exist"},
	{"version", "print the version (also --version)"},
	{"help", "print this list (also --help)"},
}

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

// cmdFunc runs a command with the arguments after its name.
type cmdFunc func(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int

// dispatch is every command relayd accepts, by name; aliases maps the
// other spellings of some.
var dispatch = map[string]cmdFunc{
	"run":      cmdRun,
	"migrate":  cmdMigrate,
	"status":   cmdStatus,
	"phase":    cmdPhase,
	"backfill": cmdBackfill,
	"replay":   cmdReplay,
	"cutover":  cmdCutover,
	"verify":   cmdVerify,
	"outbox":   cmdOutbox,
	"tail":     cmdTail,
	"routes":   cmdRoutes,
	"version": func(args []string, stdout, stderr io.Writer, _ envconfig.Lookuper) int {
		return cmdVersion(args, stdout, stderr)
	},
	"help": cmdHelp,
}

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
// environment of the test's choosing.
func run(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	name := args[0]
	if a, ok := aliases[name]; ok {
		name = a
	}
	if cmd, ok := dispatch[name]; ok {
		return cmd(args[1:], stdout, stderr, env)
	}
	if strings.HasPrefix(name, "-") {
		fmt.Fprintf(stderr, "relayd: unknown flag %s (see relayd --help)\n", name)
		return exitUsage
	}
	fmt.Fprintf(stderr, "relayd: unknown command %q\n\n%s", name, usage)
	return exitUsage
}

func cmdHelp(args []string, stdout, stderr io.Writer, _ envconfig.Lookuper) int {
	if len(args) == 1 && aliases[args[0]] == "help" {
		args = nil // relayd help --help
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "relayd: unexpected argument %q: for a command's help, relayd COMMAND --help\n", args[0])
		return exitUsage
	}
	fmt.Fprint(stdout, usage)
	return exitOK
}

// configOrExit loads the configuration, printing one line on failure. It
// sets GOMAXPROCS too: here, after the flags, so that a bad value does not
// stand between an operator and --help.
func configOrExit(stderr io.Writer, env envconfig.Lookuper) (*config, int) {
	n, err := procs(env)
	var cfg *config
	if err == nil {
		cfg, err = loadConfig(context.Background(), env)
	}
	if err != nil {
		fmt.Fprintf(stderr, "relayd: config: %v\n", err)
		return nil, exitUsage
	}
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	return cfg, exitOK
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
func signalContext(log *slog.Logger) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
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
