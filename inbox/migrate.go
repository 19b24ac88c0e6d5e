package inbox

import (
	"context"
	"database/sql"
	"embed"
	"log/slog"

	"github.com/pressly/goose/v3"

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

// migrations are the inbox table's, applied like the outbox's.
var migrations = schema.Migrations{FS: migrationFiles, LockID: lockID}

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
	return migrations.Provider(db, t, logger)
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
	_, err = migrations.Up(ctx, db, t, nil)
	return err
}
