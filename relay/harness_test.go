package relay_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// relayFixture is an outbox of the test's own, for the tests that run a
// relay on the real brokers from outside the package.
type relayFixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	table schema.Table
}

func newRelayFixture(t *testing.T) *relayFixture {
	t.Helper()
	pool := testenv.Pool(t)
	return &relayFixture{t: t, pool: pool, table: testenv.Outbox(t, pool)}
}

// start runs a relay with cfg until the test ends; prepare, when given,
// sets its hooks first.
func (f *relayFixture) start(cfg relay.Config, prepare ...func(*relay.Relay)) *relay.Relay {
	f.t.Helper()
	r, err := relay.New(f.pool, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, p := range prepare {
		p(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }() //nolint:errcheck // ends with the test
	f.t.Cleanup(func() { cancel(); <-done })
	return r
}

// insert writes n rows of topic with plain SQL and returns their message ids.
func (f *relayFixture) insert(n int, topic string) []string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, payload)
		SELECT @topic, '\x7b7d' FROM generate_series(1, @rows) RETURNING message_id::text`, pgx.NamedArgs{"topic": topic, "rows": n})
	if err != nil {
		f.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	return ids
}

// done reports whether every row of ids is in the delivered table.
func (f *relayFixture) done(ids ...string) bool {
	var n int
	err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.table.Delivered()+` WHERE message_id = ANY(@message_ids::uuid[])`, pgx.NamedArgs{"message_ids": ids}).Scan(&n)
	return err == nil && n == len(ids)
}

// stats reads target's backlog figures, as relayd_outbox_lag_seconds does.
func (f *relayFixture) stats(target relay.Target) relay.TargetStats {
	f.t.Helper()
	s, err := relay.ReadStats(context.Background(), f.pool, f.table, []relay.Target{target})
	if err != nil {
		f.t.Fatal(err)
	}
	return s[0]
}

// attempts sums the failed attempts of ids' rows on the target whose column
// prefix is p ("amqp", "nats").
func (f *relayFixture) attempts(p string, ids []string) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT coalesce(sum(`+p+`_attempts), 0) FROM `+f.table.Owed()+
		` WHERE message_id = ANY(@message_ids::uuid[])`, pgx.NamedArgs{"message_ids": ids}).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// tried reports whether every row of ids has failed at least once on the
// target whose column prefix is p: its last error is recorded.
func (f *relayFixture) tried(p string, ids []string) bool {
	var n int
	err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.table.Owed()+
		` WHERE message_id = ANY(@message_ids::uuid[]) AND `+p+`_last_error IS NOT NULL`, pgx.NamedArgs{"message_ids": ids}).Scan(&n)
	return err == nil && n == len(ids)
}
