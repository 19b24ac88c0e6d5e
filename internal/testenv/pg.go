package testenv

import (
	"context"
	"testing"
	"time"

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
