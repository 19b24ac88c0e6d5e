package inbox

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/relayd/relayd/schema"
)

// The inbox table's migrations are SQL templates, rendered for the
// configured table name and run as goose Go migrations, like the outbox's
// (package schema).
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// lockID is the advisory lock goose holds while migrating inbox tables. It
// differs from package schema's so that a service migrating its inbox never
// waits for, or is mistaken for, a relayd migrating the outbox.
const lockID = 0x72656c6179642d69 // "relayd-i"

// templateData is what the migration templates see.
type templateData struct{ t schema.Table }

func (d templateData) Table() string { return d.t.Ident() }
func (d templateData) Name() string  { return d.t.Name }

func render(file string, t schema.Table) (string, error) {
	src, err := migrationFiles.ReadFile("migrations/" + file)
	if err != nil {
		return "", err
	}
	tmpl, err := template.New(file).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", file, err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, templateData{t}); err != nil {
		return "", fmt.Errorf("render %s: %w", file, err)
	}
	return b.String(), nil
}

// migrations lists the migrations in version order: files are named
// NNNNN_name.up.sql and NNNNN_name.down.sql.
func migrations(t schema.Table) ([]*goose.Migration, error) {
	entries, err := migrationFiles.ReadDir("migrations")
	if err != nil {
		return nil, err
	}
	var out []*goose.Migration
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".up.sql") {
			continue
		}
		var version int64
		if _, err := fmt.Sscanf(name, "%05d_", &version); err != nil {
			return nil, fmt.Errorf("migration %s: no version prefix", name)
		}
		up, err := render(name, t)
		if err != nil {
			return nil, err
		}
		down, err := render(strings.TrimSuffix(name, ".up.sql")+".down.sql", t)
		if err != nil {
			return nil, err
		}
		out = append(out, goose.NewGoMigration(version, execTx(up), execTx(down)))
	}
	return out, nil
}

func execTx(q string) *goose.GoFunc {
	return &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q)
		return err
	}}
}

// versionTable is goose's record of applied migrations for t:
// <table>_schema_version, in t's schema.
func versionTable(t schema.Table) string {
	if t.Schema == "" {
		return t.Name + "_schema_version"
	}
	return t.Schema + "." + t.Name + "_schema_version"
}

func parseTable(table string) (schema.Table, error) {
	if table == "" {
		table = DefaultTable
	}
	return schema.ParseTable(table)
}

// NewProvider returns a goose provider for the migrations of the inbox table
// named table ("" means [DefaultTable]), for a service that runs it in its
// own migration step: Up, Status, HasPending, Down. Applied versions are
// recorded in <table>_schema_version. Unlike [Migrate], the provider does
// not create a missing schema. db must be a direct connection (session
// advisory locks do not survive transaction pooling). logger may be nil.
func NewProvider(db *sql.DB, table string, logger *slog.Logger) (*goose.Provider, error) {
	t, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	migs, err := migrations(t)
	if err != nil {
		return nil, err
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID))
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithTableName(versionTable(t)),
		goose.WithSessionLocker(locker),
		goose.WithGoMigrations(migs...),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
	)
}

// Migrate creates or upgrades the inbox table named table ("" means
// [DefaultTable]), creating its schema first if it is named and missing. It
// is safe to call from several processes at once: goose holds a Postgres
// session advisory lock while migrating.
func Migrate(ctx context.Context, db *sql.DB, table string) error {
	t, err := parseTable(table)
	if err != nil {
		return err
	}
	if t.Schema != "" {
		if err := createSchema(ctx, db, t.Schema); err != nil {
			return fmt.Errorf("create schema %s: %w", t.Schema, err)
		}
	}
	p, err := NewProvider(db, table, nil)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", t, err)
	}
	return nil
}

// createSchema creates a schema if it is missing. CREATE SCHEMA IF NOT
// EXISTS fails with a unique violation when another session creates the
// same schema at the same moment (an inbox or an outbox migration): that
// failure means the schema exists.
func createSchema(ctx context.Context, db *sql.DB, name string) error {
	_, err := db.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS "`+name+`"`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
		return nil
	}
	return err
}
