package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/schema"
)

const migrateHelp = `Usage: relayd migrate [up|status|down-to VERSION] [--inbox TABLE] [--json]

Creates or upgrades the outbox table named by RELAY_OUTBOX_TABLE (default
"outbox") in RELAY_DATABASE_URL — or, with --inbox, a consumer's inbox table
(package inbox). Safe to run from several instances at once: a Postgres
advisory lock serialises them (one waits up to an hour for another).

  up       apply pending migrations (default)
  status   list migrations and whether each is applied
  down-to VERSION
           undo the outbox's migrations after VERSION (12 at the earliest),
           for a relayd of an earlier release; stop the relays first

Waits up to RELAY_STARTUP_TIMEOUT for Postgres (a deploy step may start
with it).

Flags:
`

func cmdMigrate(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	inboxTable := fs.String("inbox", "", "migrate this inbox table (name or schema.name) instead of the outbox")
	asJSON := fs.Bool("json", false, "print what was applied, or the status, as JSON")
	if code, done := parseFlagsArgs(fs, args, stdout, stderr, withFlagDefaults(fs, migrateHelp)); done {
		return code
	}
	action := actions["migrate"][0]
	if fs.NArg() > 0 {
		action = fs.Arg(0)
	}
	var downTo int64
	switch {
	case !isAction("migrate", action):
		fmt.Fprintf(stderr, "relayd migrate: unknown action %q: want up, status or (outbox only) down-to (see relayd migrate --help)\n", action)
		return exitUsage
	case action == "down-to" && *inboxTable != "":
		fmt.Fprintln(stderr, "relayd migrate: down-to is for the outbox only, not --inbox (see relayd migrate --help)")
		return exitUsage
	case action == "down-to":
		v, err := strconv.ParseInt(fs.Arg(1), 10, 64)
		if fs.NArg() != 2 || err != nil || v < schema.RollBackFloor {
			fmt.Fprintf(stderr, "relayd migrate: down-to wants one version, %d or later: earlier downs drop the delivered record\n", schema.RollBackFloor)
			return exitUsage
		}
		downTo = v
	case fs.NArg() > 1:
		fmt.Fprintf(stderr, "relayd migrate: unexpected argument %q: one action at most (see relayd migrate --help)\n", fs.Arg(1))
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
		fmt.Fprintln(stderr, commandPrefix("migrate")+postgresFailure(cfg, err))
		return exitFailure
	}
	defer closeDB()

	if *inboxTable != "" {
		return migrateInbox(ctx, db, *inboxTable, action, *asJSON, stdout, log)
	}
	if action == "down-to" {
		res, err := schema.RollBack(ctx, db, cfg.table, downTo, log)
		if err != nil {
			log.Error("migrate down", "table", cfg.table.String(), "error", err.Error())
			return exitFailure
		}
		if *asJSON {
			return printJSON(stdout, map[string]any{"table": cfg.table.String(), "undone": versions(res)})
		}
		fmt.Fprintf(stdout, "%s: %d migration(s) undone\n", cfg.table, len(res))
		return exitOK
	}
	if action == "status" {
		st, err := schema.Status(ctx, db, cfg.table)
		if err != nil {
			log.Error("migration status", "error", err.Error())
			return exitFailure
		}
		printMigrationStatus(stdout, st, *asJSON)
		return exitOK
	}
	res, err := schema.Up(ctx, db, cfg.table, log)
	if err != nil {
		log.Error("migrate", "table", cfg.table.String(), "error", err.Error())
		return exitFailure
	}
	if *asJSON {
		return printJSON(stdout, map[string]any{"table": cfg.table.String(), "applied": versions(res)})
	}
	fmt.Fprintf(stdout, "%s: %d migration(s) applied\n", cfg.table, len(res))
	return exitOK
}

// versions is the versions of the migrations in res.
func versions(res []*goose.MigrationResult) []int64 {
	v := make([]int64, 0, len(res))
	for _, r := range res {
		v = append(v, r.Source.Version)
	}
	return v
}

// migrationJSON is one migration in migrate status --json.
type migrationJSON struct {
	Version   int64      `json:"version"`
	State     string     `json:"state"`
	AppliedAt *time.Time `json:"applied_at"`
}

func printMigrationStatus(w io.Writer, st []*goose.MigrationStatus, asJSON bool) {
	if asJSON {
		out := make([]migrationJSON, 0, len(st))
		for _, s := range st {
			m := migrationJSON{Version: s.Source.Version, State: string(s.State)}
			if !s.AppliedAt.IsZero() {
				at := s.AppliedAt
				m.AppliedAt = &at
			}
			out = append(out, m)
		}
		printJSON(w, out)
		return
	}
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
func migrateInbox(ctx context.Context, db *sql.DB, table, action string, asJSON bool, stdout io.Writer, log *slog.Logger) int {
	if action == "status" {
		p, err := inbox.NewProvider(db, table, log)
		if err == nil {
			var st []*goose.MigrationStatus
			if st, err = p.Status(ctx); err == nil {
				printMigrationStatus(stdout, st, asJSON)
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
	if asJSON {
		return printJSON(stdout, map[string]any{"inbox": table, "migrated": true})
	}
	fmt.Fprintf(stdout, "inbox %s: migrated\n", table)
	return exitOK
}

// openDB opens database/sql over a small pgx pool, for goose. It does not
// log the wait: migrate prints the outcome only, on one line, as the other
// one-shot commands do.
func openDB(ctx context.Context, cfg *config) (*sql.DB, func(), error) {
	pool, err := newPool(ctx, cfg, 2)
	if err != nil {
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	return db, func() { db.Close(); pool.Close() }, nil
}
