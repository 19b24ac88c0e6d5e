package testenv

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayd/relayd/schema"
)

// Pool connects to the test database; the pool is closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, DatabaseURL(t))
	if err != nil {
		t.Fatalf("connect to postgres: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Outbox creates a schema of the test's own, migrates an outbox table into
// it and drops the schema when the test ends.
func Outbox(t testing.TB, pool *pgxpool.Pool) schema.Table {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	table := schema.Table{Schema: Name("t"), Name: "outbox"}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := schema.Up(ctx, db, table, nil); err != nil {
		t.Fatalf("migrate %s: %v", table, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA "`+table.Schema+`" CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", table.Schema, err)
		}
	})
	return table
}

// Checks counts the CHECK constraints on table t.
func Checks(t testing.TB, pool *pgxpool.Pool, table schema.Table) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'`, table.Ident()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// SetState gives the rows of table matching where (a condition on the
// producers' columns, args its parameters) a delivery state, as batches
// would: rows still in the outbox move to the owed table, then set (an
// UPDATE's SET list, without parameters) is applied to them there.
func SetState(t testing.TB, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, table schema.Table, set, where string, args ...any) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	const cols = `id, message_id, topic, key, headers, payload, created_at`
	var ids []int64
	err = tx.QueryRow(ctx, `SELECT coalesce(array_agg(id), '{}') FROM (SELECT id FROM `+table.Ident()+` WHERE `+where+`
		UNION ALL SELECT id FROM `+table.Owed()+` WHERE `+where+`) r`, args...).Scan(&ids)
	for _, q := range []string{
		`WITH m AS (DELETE FROM ` + table.Ident() + ` WHERE id = ANY($1) RETURNING ` + cols + `)
		INSERT INTO ` + table.Owed() + ` (` + cols + `) SELECT ` + cols + ` FROM m`,
		`UPDATE ` + table.Owed() + ` SET ` + set + ` WHERE id = ANY($1)`,
	} {
		if err == nil {
			_, err = tx.Exec(ctx, q, ids)
		}
	}
	if err == nil && len(ids) == 0 {
		err = errors.New("no row matches")
	}
	if err != nil {
		t.Fatalf("set state %s where %s: %v", set, where, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// Database creates a database of the test's own on the test server and
// returns its URL; it is dropped, sessions and all, when the test ends. For
// a test that reads what the whole database does (pg_stat_activity), which
// the other tests' sessions would muddle.
func Database(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, DatabaseURL(t))
	if err != nil {
		t.Fatalf("connect to postgres: %v", err)
	}
	defer admin.Close(ctx)
	name := Name("db")
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, DatabaseURL(t))
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `DROP DATABASE `+name+` WITH (FORCE)`); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// Session connects to url as application name app, for a test that reads
// what a session does in pg_stat_activity; it is closed when the test ends.
func Session(t testing.TB, url, app string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to postgres as %s: %v", app, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}
