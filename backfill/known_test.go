package backfill

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/testenv"
)

// The lookup of ids already moved or delivered reads every table through its
// index, however the tables grew since the lookup first ran. A plan cached
// while the table was empty scans it whole, comparing every row with every
// id of a batch: over a run of 200,000 messages that made Postgres the
// backfill's largest cost.
func TestKnownStaysOnIndexesAsTheRecordGrows(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table := testenv.Outbox(t, testenv.Pool(t))

	// One connection, so every call reuses what the earlier ones prepared;
	// auto_explain sends each statement's plan back as a notice.
	var mu sync.Mutex
	var plans []string
	pc, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	pc.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_level = notice`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `ALTER TABLE `+table.Backfilled()+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	b := &runner{cfg: Config{DB: pool, Table: table}}

	batch := func(from int) []*item {
		items := make([]*item, 256)
		for i := range items {
			items[i] = &item{id: fmt.Sprintf("moved-%d", from+i)}
		}
		return items
	}
	fill := func(from, to int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO `+table.Backfilled()+` (message_id, queue, derived)
SELECT 'moved-' || i, 'q', false FROM generate_series(@from::int, @to::int) AS i`, pgx.NamedArgs{"from": from, "to": to}); err != nil {
			t.Fatal(err)
		}
	}
	// The run's first batches: enough calls for Postgres to settle on a
	// plan for the statement, while the table holds a few batches.
	fill(0, 999)
	for i := range 10 {
		if _, err := b.known(ctx, batch(i*256)); err != nil {
			t.Fatal(err)
		}
	}
	fill(1000, 19999)
	mu.Lock()
	plans = nil
	mu.Unlock()

	known, err := b.known(ctx, batch(19900)) // 100 moved, 156 not
	if err != nil {
		t.Fatal(err)
	}
	if len(known) != 100 || !known["moved-19900"] || !known["moved-19999"] || known["moved-20000"] {
		t.Fatalf("known %d ids, want moved-19900..moved-19999", len(known))
	}
	mu.Lock()
	defer mu.Unlock()
	var plan string
	for _, p := range plans {
		if strings.Contains(p, table.Name+"_backfilled") {
			plan = p
		}
	}
	if plan == "" {
		t.Fatalf("no plan of the lookup among %d notices", len(plans))
	}
	if strings.Contains(plan, "Seq Scan") {
		t.Fatalf("the lookup scans a whole table:\n%s", plan)
	}
	// The delivered table is read through its message_id index, which
	// holds only the rows RabbitMQ may have (migration 00006): the lookup
	// has to say so for Postgres to use it.
	if !strings.Contains(plan, table.Name+"_delivered_message_id") {
		t.Fatalf("the lookup does not read %s through its message_id index:\n%s", table.Delivered(), plan)
	}
	for _, index := range []string{table.Name + "_message_id_key", table.Name + "_owed_message_id"} {
		if !strings.Contains(plan, index) {
			t.Fatalf("the lookup does not use %s:\n%s", index, plan)
		}
	}
}

// Rows still to relay: the lookup knows a fresh row of the outbox and a row
// of the owed table delivered or owed to JetStream, not one parked for it or
// finished without it.
func TestKnownAsksAboutRowsStillToRelay(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	ids := []string{
		"0b7f6c1e-3c55-4f8e-9a51-000000000011", // in the outbox
		"0b7f6c1e-3c55-4f8e-9a51-000000000012", // delivered to JetStream, owed to RabbitMQ
		"0b7f6c1e-3c55-4f8e-9a51-000000000013", // delivered to RabbitMQ, owed to JetStream
		"0b7f6c1e-3c55-4f8e-9a51-000000000014", // parked for JetStream
		"0b7f6c1e-3c55-4f8e-9a51-000000000015", // finished without JetStream
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (message_id, topic, payload)
		SELECT id, 't', '' FROM unnest(@message_ids::uuid[]) AS u(id)`, pgx.NamedArgs{"message_ids": ids}); err != nil {
		t.Fatal(err)
	}
	for i, set := range []string{
		`nats_delivered_at = now()`,
		`amqp_delivered_at = now()`,
		`nats_parked_at = now(), nats_attempts = 20`,
		`amqp_delivered_at = now(), done_at = now()`,
	} {
		testenv.SetState(t, pool, table, set, `message_id = @message_id`, pgx.NamedArgs{"message_id": ids[i+1]})
	}
	items := make([]*item, len(ids))
	for i, id := range ids {
		items[i] = &item{id: strings.ToUpper(id)}
	}
	known, err := (&runner{cfg: Config{DB: pool, Table: table}}).known(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, true, false, false} {
		if known[items[i].id] != want {
			t.Errorf("%s known: %v, want %v", items[i].id, known[items[i].id], want)
		}
	}
}

// Of the relay's delivered rows, the lookup knows those JetStream has and
// RabbitMQ may have too: only they can be in the legacy queue.
func TestKnownAsksAboutRowsTheRelaySentToRabbitMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	ids := []string{
		"0b7f6c1e-3c55-4f8e-9a51-000000000001", // both brokers
		"0b7f6c1e-3c55-4f8e-9a51-000000000002", // JetStream only (RELAY_TARGETS=nats)
		"0b7f6c1e-3c55-4f8e-9a51-000000000003", // RabbitMQ only (RELAY_TARGETS=amqp)
		"0b7f6c1e-3c55-4f8e-9a51-000000000004", // JetStream; RabbitMQ's confirm never came
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Delivered()+` (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent) VALUES
		(1, @both, now(), now(), true), (2, @nats_only, NULL, now(), false), (3, @amqp_only, now(), NULL, true), (4, @amqp_unconfirmed, NULL, now(), true)`,
		pgx.NamedArgs{"both": ids[0], "nats_only": ids[1], "amqp_only": ids[2], "amqp_unconfirmed": ids[3]}); err != nil {
		t.Fatal(err)
	}
	items := make([]*item, len(ids))
	for i, id := range ids {
		items[i] = &item{id: strings.ToUpper(id)}
	}
	known, err := (&runner{cfg: Config{DB: pool, Table: table}}).known(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false, true} {
		if known[items[i].id] != want {
			t.Errorf("%s known: %v, want %v", items[i].id, known[items[i].id], want)
		}
	}
}
