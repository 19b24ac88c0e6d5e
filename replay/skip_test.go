package replay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// Each id is skipped for what RabbitMQ has of it, and only then.
func TestLookup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	id := func() string { return uuid.NewString() }
	confirmed, natsOnly, owed, outboxAMQP, outboxDone, fresh := id(), id(), id(), id(), id(), id()
	upper := strings.ToUpper(id())
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO ` + table.Delivered() + ` (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent) VALUES
			(1, $1, now(), now(), true), (2, $2, NULL, now(), false), (3, $3, now(), now(), true)`, []any{confirmed, natsOnly, strings.ToLower(upper)}},
		{`INSERT INTO ` + table.Ident() + ` (message_id, topic, payload, amqp_delivered_at, nats_delivered_at, done_at) VALUES
			($1, 't', '', NULL, now(), NULL), ($2, 't', '', now(), NULL, NULL), ($3, 't', '', NULL, now(), now())`, []any{owed, outboxAMQP, outboxDone}},
		{`INSERT INTO ` + table.Backfilled() + ` (message_id, queue) VALUES ('legacy-1', 'q')`, nil},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]skip{
		confirmed: skipDelivered, upper: skipDelivered, natsOnly: send, owed: skipOwed, outboxAMQP: skipOwed,
		outboxDone: send, fresh: send, "legacy-1": skipBackfilled, "legacy-2": send,
	}
	var items []item
	for id := range want {
		items = append(items, item{msg: &relay.Message{MessageID: id}})
	}
	items = append(items, item{skip: skipWithoutID})
	r := &runner{cfg: Config{DB: pool, Table: table}}
	if err := r.lookup(ctx, items); err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.msg == nil {
			if it.skip != skipWithoutID {
				t.Errorf("an item without id became %q", it.skip)
			}
			continue
		}
		if it.skip != want[it.msg.MessageID] {
			t.Errorf("%s: %q, want %q", it.msg.MessageID, it.skip, want[it.msg.MessageID])
		}
	}
}

// The delivered lookup stays on the message_id index, which is partial
// (migration 00006): a predicate that does not imply the index's would read
// the whole delivered table every batch.
func TestDeliveredLookupUsesItsIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	q := outboxsql.For(table)
	for name, sql := range map[string]string{"ReplayDelivered": q.ReplayDelivered, "ReplayOwed": q.ReplayOwed} {
		var plan strings.Builder
		rows, err := tx.Query(ctx, "EXPLAIN "+sql, []string{uuid.NewString()})
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			rows.Scan(&line) //nolint:errcheck // read below
			plan.WriteString(line + "\n")
		}
		rows.Close()
		index := table.Name + "_delivered_message_id"
		if name == "ReplayOwed" {
			index = table.Name + "_message_id_key"
		}
		if !strings.Contains(plan.String(), index) {
			t.Errorf("%s does not use %s:\n%s", name, index, plan.String())
		}
	}
}

// A row the relays finish while a lookup runs leaves the outbox for the
// delivered record in one commit: the lookup finds it in one or the other,
// never in neither (RabbitMQ would get it a second time). The test holds a
// lock on the outbox so the commit falls between the lookup's statements.
func TestLookupSeesARowThatLeavesTheOutboxMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	// One connection, its statements prepared by a first lookup: the later
	// one waits for the lock only where it executes, not in a Parse.
	pcfg := pool.Config().Copy()
	pcfg.MaxConns, pcfg.MinConns = 1, 0
	one, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	r := &runner{cfg: Config{DB: one, Table: table}}
	if err := r.lookup(ctx, []item{{msg: &relay.Message{MessageID: uuid.NewString()}}}); err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (message_id, topic, payload, nats_delivered_at) VALUES ($1, 't', '', now())`, id); err != nil {
		t.Fatal(err)
	}
	// The relay sends it to RabbitMQ and finishes it, under a lock the
	// lookup waits for.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	for _, q := range []string{
		`LOCK TABLE ` + table.Ident() + ` IN ACCESS EXCLUSIVE MODE`,
		`WITH del AS (DELETE FROM ` + table.Ident() + ` WHERE message_id = $1 RETURNING id, message_id, nats_delivered_at)
			INSERT INTO ` + table.Delivered() + ` (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at)
			SELECT id, message_id, now(), nats_delivered_at, true, now() FROM del`,
	} {
		if _, err := tx.Exec(ctx, q, pgxArgs(q, id)...); err != nil {
			t.Fatal(err)
		}
	}
	items := []item{{msg: &relay.Message{MessageID: id}}}
	looked := make(chan error, 1)
	go func() { looked <- r.lookup(ctx, items) }()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = $1::regclass AND NOT granted)`, table.Ident()).Scan(&waiting)
		return err == nil && waiting
	}, "the lookup never waited for the outbox's lock")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-looked; err != nil {
		t.Fatal(err)
	}
	if items[0].skip != skipDelivered {
		t.Errorf("a row finished during the lookup: %q, want %q (RabbitMQ has it)", items[0].skip, skipDelivered)
	}
}

// pgxArgs gives q the id when it takes a parameter.
func pgxArgs(q, id string) []any {
	if strings.Contains(q, "$1") {
		return []any{id}
	}
	return nil
}
