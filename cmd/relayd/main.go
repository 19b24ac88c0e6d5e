// Command relayd relays committed outbox rows from Postgres to RabbitMQ and
// NATS JetStream. This package only reads the environment and flags, wires
// the packages together and maps failures to exit codes: 0 done, 1 failed,
// 2 bad configuration or usage.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/schema"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

const usage = `relayd relays outbox rows from Postgres to RabbitMQ and NATS JetStream.

Usage:
  relayd run        relay until SIGINT/SIGTERM (a second signal exits at once)
  relayd migrate    create or upgrade the outbox table (up, the default, or status)
  relayd status     how far behind each target is (--json for scripts)
  relayd backfill   move a legacy RabbitMQ queue into the JetStream stream, exactly once
  relayd cutover check  may consumers switch to JetStream exclusively?
  relayd verify     check the stream against the outbox's record (exit 1 if anything is missing or duplicated)
  relayd outbox parked|retry   list parked rows; put them back in line
  relayd tail       print each message reaching the stream and the exchange, until Ctrl-C
  relayd version    print the version

Each command takes --help. Configuration comes from RELAY_* environment
variables; see README.md for the full table.
`

func main() {
	env := envconfig.OsLookuper()
	n, err := procs(env)
	if err != nil {
		fmt.Fprintf(os.Stderr, "relayd: config: %v\n", err)
		os.Exit(exitUsage)
	}
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, env))
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
	case "backfill":
		return cmdBackfill(args[1:], stdout, stderr, env)
	case "cutover":
		return cmdCutover(args[1:], stdout, stderr, env)
	case "verify":
		return cmdVerify(args[1:], stdout, stderr, env)
	case "outbox":
		return cmdOutbox(args[1:], stdout, stderr, env)
	case "tail":
		return cmdTail(args[1:], stdout, stderr, env)
	case "version":
		fmt.Fprintf(stdout, "relayd %s (%s)\n", version, runtime.Version())
		return exitOK
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "relayd: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

// parseFlags parses a subcommand's flags; done reports that the command
// should exit with code (help printed, or a usage error).
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, help string) (code int, done bool) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, help)
			return exitOK, true
		}
		fmt.Fprintf(stderr, "relayd %s: %v\n", fs.Name(), err)
		return exitUsage, true
	}
	return 0, false
}

// withFlagDefaults appends fs's flags, with their defaults, to help.
func withFlagDefaults(fs *flag.FlagSet, help string) string {
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	return help + b.String()
}

// configOrExit loads the configuration, printing one line on failure.
func configOrExit(stderr io.Writer, env envconfig.Lookuper) (*config, int) {
	cfg, err := loadConfig(context.Background(), env)
	if err != nil {
		fmt.Fprintf(stderr, "relayd: config: %v\n", err)
		return nil, exitUsage
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

const migrateHelp = `Usage: relayd migrate [--inbox TABLE] [up|status]

Creates or upgrades the outbox table named by RELAY_OUTBOX_TABLE (default
"outbox") in RELAY_DATABASE_URL — or, with --inbox, a consumer's inbox table
(package inbox). Safe to run from several instances at once: a Postgres
advisory lock serialises them (one waits up to an hour for another).

  up       apply pending migrations (default)
  status   list migrations and whether each is applied
  --inbox TABLE   migrate the inbox table TABLE (name or schema.name) instead
`

func cmdMigrate(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	inboxTable := fs.String("inbox", "", "migrate this inbox table instead of the outbox")
	if code, done := parseFlags(fs, args, stdout, stderr, migrateHelp); done {
		return code
	}
	action := "up"
	if fs.NArg() > 1 {
		fmt.Fprintf(stderr, "relayd migrate: one action at most\n")
		return exitUsage
	}
	if fs.NArg() == 1 {
		action = fs.Arg(0)
	}
	if action != "up" && action != "status" {
		fmt.Fprintf(stderr, "relayd migrate: unknown action %q: want up or status\n", action)
		return exitUsage
	}
	if *inboxTable != "" {
		if _, err := schema.ParseTable(*inboxTable); err != nil {
			fmt.Fprintf(stderr, "relayd migrate: --inbox %q is not a valid table name: want name or schema.name, lower-case letters, digits and _\n", *inboxTable)
			return exitUsage
		}
	}
	cfg, code := configOrExit(stderr, env)
	if cfg == nil {
		return code
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signalContext(log)
	defer stop()
	db, closeDB, err := openDB(ctx, cfg)
	if err != nil {
		log.Error("connect to postgres", "error", err.Error())
		return exitFailure
	}
	defer closeDB()

	if *inboxTable != "" {
		return migrateInbox(ctx, db, *inboxTable, action, stdout, log)
	}
	if action == "status" {
		st, err := schema.Status(ctx, db, cfg.table)
		if err != nil {
			log.Error("migration status", "error", err.Error())
			return exitFailure
		}
		printMigrationStatus(stdout, st)
		return exitOK
	}
	res, err := schema.Up(ctx, db, cfg.table, log)
	if err != nil {
		log.Error("migrate", "table", cfg.table.String(), "error", err.Error())
		return exitFailure
	}
	fmt.Fprintf(stdout, "%s: %d migration(s) applied\n", cfg.table, len(res))
	return exitOK
}

func printMigrationStatus(w io.Writer, st []*goose.MigrationStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "VERSION\tSTATE\tAPPLIED AT\n")
	for _, s := range st {
		at := "-"
		if !s.AppliedAt.IsZero() {
			at = s.AppliedAt.Format("2006-01-02 15:04:05Z07:00")
		}
		fmt.Fprintf(tw, "%05d\t%s\t%s\n", s.Source.Version, s.State, at)
	}
	tw.Flush()
}

// migrateInbox applies (or reports) a consumer inbox table's migrations.
func migrateInbox(ctx context.Context, db *sql.DB, table, action string, stdout io.Writer, log *slog.Logger) int {
	if action == "status" {
		p, err := inbox.NewProvider(db, table, log)
		if err == nil {
			var st []*goose.MigrationStatus
			if st, err = p.Status(ctx); err == nil {
				printMigrationStatus(stdout, st)
				return exitOK
			}
		}
		log.Error("inbox migration status", "table", table, "error", err.Error())
		return exitFailure
	}
	if err := inbox.Migrate(ctx, db, table); err != nil {
		log.Error("migrate inbox", "table", table, "error", err.Error())
		return exitFailure
	}
	fmt.Fprintf(stdout, "inbox %s: migrated\n", table)
	return exitOK
}

// openDB opens database/sql over a small pgx pool, for goose.
func openDB(ctx context.Context, cfg *config) (*sql.DB, func(), error) {
	pool, err := newPool(ctx, cfg, 2)
	if err != nil {
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	return db, func() { db.Close(); pool.Close() }, nil
}
