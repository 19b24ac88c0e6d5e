// Package phasetest runs relays' reports for tests of what reads them.
package phasetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/schema"
)

// Relay reports in as a running relay of table, on a session of its own
// that ends with the test (or with the returned conn's Close: a kill); the
// Presence reports it again.
func Relay(t testing.TB, pool *pgxpool.Pool, table schema.Table, in phase.Instance) (*phase.Presence, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatalf("connect to postgres: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	p, err := phase.Present(ctx, c, table)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Report(ctx, in); err != nil {
		t.Fatal(err)
	}
	return p, c
}
