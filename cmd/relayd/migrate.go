package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

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

// migrateCommand is relayd migrate: the outbox's migrations, or an inbox's.
type migrateCommand struct {
	*cli
	inbox  string
	asJSON bool
}

func (c *migrateCommand) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.StringVar(&c.inbox, "inbox", "", "migrate this inbox table (name or schema.name) instead of the outbox")
	fs.BoolVar(&c.asJSON, "json", false, "print what was applied, or the status, as JSON")
	return fs
}

func (c *migrateCommand) Usage() string { return withFlagDefaults(c.flags(), migrateHelp) }

func (c *migrateCommand) Run(ctx context.Context, args []string) error {
	fs := c.flags()
	if err := parseFlagsArgs(fs, args); err != nil {
		return err
	}
	action := actions["migrate"][0]
	if fs.NArg() > 0 {
		action = fs.Arg(0)
	}
	var downTo int64
	switch {
	case !isAction("migrate", action):
		return usagef("unknown action %q: want up, status or (outbox only) down-to (see relayd migrate --help)", action)
	case action == "down-to" && c.inbox != "":
		return usagef("down-to is for the outbox only, not --inbox (see relayd migrate --help)")
	case action == "down-to":
		v, err := strconv.ParseInt(fs.Arg(1), 10, 64)
		if fs.NArg() != 2 || err != nil || v < schema.RollBackFloor {
			return usagef("down-to wants one version, %d or later: earlier downs drop the delivered record", schema.RollBackFloor)
		}
		downTo = v
	case fs.NArg() > 1:
		return usagef("unexpected argument %q: one action at most (see relayd migrate --help)", fs.Arg(1))
	}
	if c.inbox != "" {
		if _, err := schema.ParseTable(c.inbox); err != nil {
			return usagef("--inbox %q is not a valid table name: want name or schema.name, lower-case letters, digits and _", c.inbox)
		}
	}
	cfg, err := c.config(c.env)
	if err != nil {
		return err
	}
	log := c.log
	ctx, stop := signalContext(ctx, log)
	defer stop()
	db, closeDB, err := openDB(ctx, cfg)
	if err != nil {
		return errors.New(postgresFailure(cfg, err))
	}
	defer closeDB()

	if c.inbox != "" {
		return migrateInbox(ctx, db, c.inbox, action, c.asJSON, c.stdout, log)
	}
	table := cfg.table.String()
	switch action {
	case "down-to":
		res, err := schema.RollBack(ctx, db, cfg.table, downTo, log)
		if err != nil {
			return logged("migrate down", err, "table", table)
		}
		if c.asJSON {
			return printJSON(c.stdout, map[string]any{"table": table, "undone": versions(res)})
		}
		fmt.Fprintf(c.stdout, "%s: %d migration(s) undone\n", cfg.table, len(res))
	case "status":
		st, err := schema.Status(ctx, db, cfg.table)
		if err != nil {
			return logged("migration status", err)
		}
		printMigrationStatus(c.stdout, st, c.asJSON)
	default:
		res, err := schema.Up(ctx, db, cfg.table, log)
		if err != nil {
			return logged("migrate", err, "table", table)
		}
		if c.asJSON {
			return printJSON(c.stdout, map[string]any{"table": table, "applied": versions(res)})
		}
		fmt.Fprintf(c.stdout, "%s: %d migration(s) applied\n", cfg.table, len(res))
	}
	return nil
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
func migrateInbox(ctx context.Context, db *sql.DB, table, action string, asJSON bool, stdout io.Writer, log *slog.Logger) error {
	if action == "status" {
		p, err := inbox.NewProvider(db, table, log)
		if err == nil {
			var st []*goose.MigrationStatus
			if st, err = p.Status(ctx); err == nil {
				printMigrationStatus(stdout, st, asJSON)
				return nil
			}
		}
		return logged("inbox migration status", err, "table", table)
	}
	if err := inbox.Migrate(ctx, db, table); err != nil {
		return logged("migrate inbox", err, "table", table)
	}
	if asJSON {
		return printJSON(stdout, map[string]any{"inbox": table, "migrated": true})
	}
	fmt.Fprintf(stdout, "inbox %s: migrated\n", table)
	return nil
}

// migrateConns is migrate's pool: goose holds its advisory lock on one
// connection while it migrates on the other.
const migrateConns = 2

// openDB opens database/sql over a small pgx pool, for goose. It does not
// log the wait: migrate prints the outcome only, on one line, as the other
// one-shot commands do.
func openDB(ctx context.Context, cfg *config) (*sql.DB, func(), error) {
	pool, err := newPool(ctx, cfg, migrateConns)
	if err != nil {
		return nil, nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	return db, func() { db.Close(); pool.Close() }, nil
}
