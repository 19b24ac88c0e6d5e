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

// commands lists the top-level commands for the usage, which aligns them.
var commands = []struct{ name, what string }{
	{"run", "relay until SIGINT/SIGTERM (a second signal exits at once)"},
	{"migrate [up|status]", "create or upgrade the outbox table (or list its migrations)"},
	{"status", "how far behind each target is, the phase and the running relays"},
	{"phase [show|set]", "the migration phase the relays share: show it, or set it (amqp, dual, nats)"},
	{"backfill", "move a legacy RabbitMQ queue into the JetStream stream, exactly once"},
	{"replay", "roll back: publish to the legacy exchange what the stream got while RabbitMQ did not"},
	{"cutover check", "may consumers switch to JetStream exclusively?"},
	{"verify", "check the stream against the outbox's record (exit 1 if anything is missing or duplicated)"},
	{"outbox parked", "list parked rows"},
	{"outbox retry", "put parked rows back in line"},
	{"tail", "print each message reaching the stream and the exchange, until Ctrl-C"},
	{"routes check", "list the routes (RELAY_ROUTES) and check their exchanges and streams exist"},
	{"version", "print the version (also --version)"},
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
Each command takes --help; every flag is written --flag. Commands that
report take --json. Configuration comes from RELAY_* environment variables;
see docs/configuration.md for the full table.
`)
	return b.String()
}()

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
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr, env)
	case "migrate":
		return cmdMigrate(args[1:], stdout, stderr, env)
	case "status":
		return cmdStatus(args[1:], stdout, stderr, env)
	case "phase":
		return cmdPhase(args[1:], stdout, stderr, env)
	case "backfill":
		return cmdBackfill(args[1:], stdout, stderr, env)
	case "replay":
		return cmdReplay(args[1:], stdout, stderr, env)
	case "cutover":
		return cmdCutover(args[1:], stdout, stderr, env)
	case "verify":
		return cmdVerify(args[1:], stdout, stderr, env)
	case "outbox":
		return cmdOutbox(args[1:], stdout, stderr, env)
	case "tail":
		return cmdTail(args[1:], stdout, stderr, env)
	case "routes":
		return cmdRoutes(args[1:], stdout, stderr, env)
	case "version", "-version", "--version":
		return cmdVersion(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "relayd: unexpected argument %q: for a command's help, relayd COMMAND --help\n", args[1])
			return exitUsage
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		if strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(stderr, "relayd: unknown flag %s (see relayd --help)\n", args[0])
			return exitUsage
		}
		fmt.Fprintf(stderr, "relayd: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
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
