// Package schema owns the outbox table: its name rules and its migrations.
//
// The table is a public contract that producers in any language write to, so
// its DDL lives here once, embedded in the binary, and is applied by goose
// with a Postgres session lock so that several relayd instances starting at
// the same moment do not race. The table name is configurable, so migrations
// are SQL templates rendered for one [Table] and run as goose Go migrations.
//
// The binary, the outbox package and the inbox package use it; other
// programs apply the migrations through `relayd migrate`, not this API.
package schema

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"regexp"
	"strings"
	"testing/fstest"
	"text/template"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// DefaultTable is the outbox table's name when none is configured.
const DefaultTable = "outbox"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// identRe is what a table or schema name may be: a lower-case, unquoted
// Postgres identifier. Restricting names this way means the quoted and the
// unquoted spelling are the same table, so goose's version table, psql users
// and relayd all agree on which table is meant.
var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxNameLen leaves room for the suffixes of derived names (indexes,
// functions, the version table) within Postgres's 63-byte identifiers.
const maxNameLen = 40

// ErrInvalidTable is returned by [ParseTable] for a name that is not allowed.
var ErrInvalidTable = errors.New("invalid table name")

// Table is a validated, optionally schema-qualified outbox table name.
type Table struct {
	Schema string // "" means the connection's search_path (normally public)
	Name   string
}

// ParseTable validates "name" or "schema.name". Each part must be a lower-case
// identifier ([a-z_][a-z0-9_]*), the name at most 40 characters.
func ParseTable(s string) (Table, error) {
	parts := strings.Split(s, ".")
	var t Table
	switch len(parts) {
	case 1:
		t.Name = parts[0]
	case 2:
		t.Schema, t.Name = parts[0], parts[1]
		if !identRe.MatchString(t.Schema) || len(t.Schema) > 63 {
			return Table{}, fmt.Errorf("%w %q: schema must match [a-z_][a-z0-9_]*", ErrInvalidTable, s)
		}
	default:
		return Table{}, fmt.Errorf("%w %q: want name or schema.name", ErrInvalidTable, s)
	}
	if !identRe.MatchString(t.Name) || len(t.Name) > maxNameLen {
		return Table{}, fmt.Errorf("%w %q: name must match [a-z_][a-z0-9_]* and be at most %d characters", ErrInvalidTable, s, maxNameLen)
	}
	return t, nil
}

// MustParseTable is ParseTable for constants; it panics on an invalid name.
func MustParseTable(s string) Table {
	t, err := ParseTable(s)
	if err != nil {
		panic(err)
	}
	return t
}

// String is the name as configured: "name" or "schema.name".
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// Ident is the quoted identifier to put in SQL.
func (t Table) Ident() string { return t.qualify(t.Name) }

func (t Table) qualify(name string) string {
	if t.Schema == "" {
		return quote(name)
	}
	return quote(t.Schema) + "." + quote(name)
}

// Channel is the LISTEN/NOTIFY channel on which inserts into the table are
// announced.
func (t Table) Channel() string {
	c := "relayd_" + strings.ReplaceAll(t.String(), ".", "_")
	if len(c) > 63 {
		h := fnv.New64a()
		h.Write([]byte(t.String()))
		c = fmt.Sprintf("relayd_%x", h.Sum64())
	}
	return c
}

// WakeLock is the advisory lock key a relay waiting for rows holds, so that
// the table's insert trigger notifies only then (migration 00007): "rely"
// in the high 32 bits, a hash of the name in the low ones.
func (t Table) WakeLock() int64 {
	h := fnv.New32a()
	h.Write([]byte(t.String()))
	return 0x72656c79<<32 | int64(h.Sum32())
}

// Backfilled is the table in which `relayd backfill` records the message ids
// it moved into JetStream.
func (t Table) Backfilled() string { return t.qualify(t.Name + "_backfilled") }

// Delivered is the table in which the relay records the message ids of rows
// it delivered to every enabled target, as it deletes them from the outbox
// or the owed table.
func (t Table) Delivered() string { return t.qualify(t.Name + "_delivered") }

// Owed is the table holding the rows a batch left owed to a target (a
// retry, an outage, parked), with their delivery state (migration 00013).
func (t Table) Owed() string { return t.qualify(t.Name + "_owed") }

// Side is the quoted identifier of the table's side table <name>_suffix
// (phase, phase_history, instances, ...).
func (t Table) Side(suffix string) string { return t.qualify(t.Name + "_" + suffix) }

// versionTable is goose's record of applied migrations for this table.
func (t Table) versionTable() string {
	if t.Schema == "" {
		return t.Name + "_schema_version"
	}
	return t.Schema + "." + t.Name + "_schema_version"
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// templateData is what the migration templates see.
type templateData struct{ t Table }

func (d templateData) Table() string   { return d.t.Ident() }
func (d templateData) Name() string    { return d.t.Name }
func (d templateData) Channel() string { return d.t.Channel() }
func (d templateData) WakeLock() int64 { return d.t.WakeLock() }
func (d templateData) Qualified(suffix string) string {
	return d.t.qualify(d.t.Name + "_" + suffix)
}

// Migrations is a set of SQL template migrations for one kind of table:
// files migrations/NNNNN_name.up.sql and NNNNN_name.down.sql in FS, rendered
// for a [Table] (the templates see .Table, .Name, .Channel, .WakeLock and
// .Qualified "suffix") and run as goose Go migrations under a Postgres
// session advisory lock, so instances starting together do not race. A
// migration whose first line is noTxMarker runs outside a transaction. The
// outbox's are this package's; package inbox has its own.
type Migrations struct {
	FS     fs.FS
	LockID int64 // the advisory lock held while migrating
}

// outbox is the outbox table's migrations.
var outbox = Migrations{FS: migrationFiles, LockID: lockID}

func (m Migrations) render(file string, t Table) (string, error) {
	src, err := fs.ReadFile(m.FS, "migrations/"+file)
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

// rendered is t's migrations: Go functions for those run in a transaction,
// SQL files for those run outside one. goose runs SQL files on the
// connection holding its lock; a Go migration outside a transaction would
// wait for another connection of the pool, which may all be taken by
// instances waiting for that lock.
type rendered struct {
	inTx []*goose.Migration
	noTx fstest.MapFS
}

// list returns the migrations rendered for t.
func (m Migrations) list(t Table) (rendered, error) {
	r := rendered{noTx: fstest.MapFS{}}
	entries, err := fs.ReadDir(m.FS, "migrations")
	if err != nil {
		return r, err
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".up.sql") {
			continue
		}
		version, err := versionOf(name)
		if err != nil {
			return r, err
		}
		up, err := m.render(name, t)
		if err != nil {
			return r, err
		}
		down, err := m.render(strings.TrimSuffix(name, ".up.sql")+".down.sql", t)
		if err != nil {
			return r, err
		}
		switch {
		case noTx(up) != noTx(down):
			return r, fmt.Errorf("migration %s: up and down must both run in a transaction, or neither", name)
		case noTx(up):
			src := "-- +goose NO TRANSACTION\n-- +goose Up\n" + up + "\n-- +goose Down\n" + down
			r.noTx[strings.TrimSuffix(name, ".up.sql")+".sql"] = &fstest.MapFile{Data: []byte(src)}
		default:
			r.inTx = append(r.inTx, goose.NewGoMigration(version, execTx(up), execTx(down)))
		}
	}
	return r, nil
}

// versionOf is the version in a migration file's name, NNNNN_name...
func versionOf(file string) (int64, error) {
	var version int64
	if _, err := fmt.Sscanf(file, "%05d_", &version); err != nil {
		return 0, fmt.Errorf("migration %s: no version prefix", file)
	}
	return version, nil
}

// newest is the highest version of m's migrations.
func (m Migrations) newest() (int64, error) {
	entries, err := fs.ReadDir(m.FS, "migrations")
	if err != nil {
		return 0, err
	}
	var newest int64
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".up.sql") {
			v, err := versionOf(e.Name())
			if err != nil {
				return 0, err
			}
			newest = max(newest, v)
		}
	}
	if newest == 0 {
		return 0, errors.New("no migrations")
	}
	return newest, nil
}

// noTxMarker, as a migration's first line, runs it outside a transaction,
// one statement at a time: for CREATE or DROP INDEX CONCURRENTLY.
const noTxMarker = "-- +relayd no-transaction"

func noTx(q string) bool { return strings.HasPrefix(q, noTxMarker+"\n") }

func execTx(q string) *goose.GoFunc {
	return &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q)
		return err
	}}
}

// Provider returns a goose provider for t's migrations; applied versions
// are recorded in <table>_schema_version beside t. db must be a direct
// connection (session advisory locks do not survive transaction pooling).
// logger may be nil.
func (m Migrations) Provider(db *sql.DB, t Table, logger *slog.Logger) (*goose.Provider, error) {
	migs, err := m.list(t)
	if err != nil {
		return nil, err
	}
	// An instance waits for another's migration up to an hour, trying
	// every 2 s: goose's default, 5 minutes, failed the instances started
	// beside one rebuilding an index on a large table.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(m.LockID), lock.WithLockTimeout(2, 1800))
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return goose.NewProvider(goose.DialectPostgres, db, migs.noTx,
		goose.WithTableName(t.versionTable()),
		goose.WithSessionLocker(locker),
		goose.WithGoMigrations(migs.inTx...),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
	)
}

// Up applies every pending migration for t, creating t's schema first if it
// is named and missing. It is safe to call from several processes at once.
func (m Migrations) Up(ctx context.Context, db *sql.DB, t Table, logger *slog.Logger) ([]*goose.MigrationResult, error) {
	if t.Schema != "" {
		if err := createSchema(ctx, db, t.Schema); err != nil {
			return nil, fmt.Errorf("create schema %s: %w", t.Schema, err)
		}
	}
	p, err := m.Provider(db, t, logger)
	if err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate %s: %w", t, err)
	}
	return res, nil
}

// lockID is the advisory lock goose holds while migrating outbox tables.
// One ID for all of them: migrations are rare and serialising them costs
// nothing.
const lockID = 0x72656c61796400 // "relayd"

// NewProvider returns a goose provider for the outbox table t.
func NewProvider(db *sql.DB, t Table, logger *slog.Logger) (*goose.Provider, error) {
	return outbox.Provider(db, t, logger)
}

// Up applies every pending outbox migration for t; see [Migrations.Up].
func Up(ctx context.Context, db *sql.DB, t Table, logger *slog.Logger) ([]*goose.MigrationResult, error) {
	return outbox.Up(ctx, db, t, logger)
}

// RollBackFloor is the earliest version [RollBack] goes down to: the downs
// before it drop records that relayd backfill and relayd verify need.
const RollBackFloor = 12

// RollBack runs t's migrations down to version (at least RollBackFloor), so
// that a relayd of an earlier release runs on it again.
func RollBack(ctx context.Context, db *sql.DB, t Table, version int64, logger *slog.Logger) ([]*goose.MigrationResult, error) {
	if version < RollBackFloor {
		return nil, fmt.Errorf("roll back to %d: not below %d", version, RollBackFloor)
	}
	p, err := NewProvider(db, t, logger)
	if err != nil {
		return nil, err
	}
	res, err := p.DownTo(ctx, version)
	if err != nil {
		return res, fmt.Errorf("roll %s back to %d: %w", t, version, err)
	}
	return res, nil
}

// createSchema creates a schema if it is missing. CREATE SCHEMA IF NOT
// EXISTS fails with a unique violation when another session (an outbox or
// an inbox migration) creates the same schema at the same moment: that
// failure means the schema exists.
func createSchema(ctx context.Context, db *sql.DB, name string) error {
	_, err := db.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+quote(name))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
		return nil
	}
	return err
}

// Status reports which migrations are applied to t.
func Status(ctx context.Context, db *sql.DB, t Table) ([]*goose.MigrationStatus, error) {
	p, err := NewProvider(db, t, nil)
	if err != nil {
		return nil, err
	}
	return p.Status(ctx)
}

// Pending reports whether t has migrations that are not applied yet.
func Pending(ctx context.Context, db *sql.DB, t Table) (bool, error) {
	p, err := NewProvider(db, t, nil)
	if err != nil {
		return false, err
	}
	return p.HasPending(ctx)
}

// minimum is Minimum's value, read once from the embedded migrations.
var minimum = func() int64 {
	v, err := outbox.newest()
	if err != nil {
		panic("schema: the embedded migrations: " + err.Error())
	}
	return v
}()

// Minimum is the oldest schema this relayd runs on, as a migration version:
// its newest migration, read from the embedded ones, so a new migration
// raises it. Its statements use what every migration made (the owed table's
// route columns of 00019, the wake-up in created_at's default of 00016), and
// it keeps no code for a table before them: `relayd migrate` first. A table
// rolled back (RollBack, down to [RollBackFloor]) is for the relayd of an
// earlier release.
func Minimum() int64 { return minimum }

// OutdatedError is [Require]'s error for a table older than [Minimum].
type OutdatedError struct {
	Table   Table
	Version int64 // the newest migration applied to the table; 0: none
	Minimum int64
}

func (e *OutdatedError) Error() string {
	return fmt.Sprintf("outbox table %s is not migrated: it is at migration %d, this relayd needs %d: run `relayd migrate`",
		e.Table, e.Version, e.Minimum)
}

// Require checks, once at start, that t is migrated to [Minimum] at least;
// for a table older than that it returns an *[OutdatedError]. Like
// [Pending], it reads t's version table without the migration lock, so it
// answers at once while another instance migrates.
func Require(ctx context.Context, db *sql.DB, t Table) error {
	p, err := NewProvider(db, t, nil)
	if err != nil {
		return err
	}
	version, _, err := p.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("check migrations of %s: %w", t, err)
	}
	if version < Minimum() {
		return &OutdatedError{Table: t, Version: version, Minimum: Minimum()}
	}
	return nil
}
