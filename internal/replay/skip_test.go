package replay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
	confirmed, natsOnly, owed, owedAMQP, owedDone, outbox, fresh := id(), id(), id(), id(), id(), id(), id()
	upper := strings.ToUpper(id())
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO ` + table.Delivered() + ` (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent) VALUES
			(1, @confirmed, now(), now(), true), (2, @nats_only, NULL, now(), false), (3, @upper_lowered, now(), now(), true)`, []any{pgx.NamedArgs{"confirmed": confirmed, "nats_only": natsOnly, "upper_lowered": strings.ToLower(upper)}}},
		{`INSERT INTO ` + table.Ident() + ` (message_id, topic, payload) VALUES
			(@owed, 't', ''), (@owed_amqp, 't', ''), (@owed_done, 't', ''), (@outbox, 't', '')`, []any{pgx.NamedArgs{"owed": owed, "owed_amqp": owedAMQP, "owed_done": owedDone, "outbox": outbox}}},
		{`INSERT INTO ` + table.Backfilled() + ` (message_id, queue) VALUES ('legacy-1', 'q')`, nil},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	testenv.SetState(t, pool, table, `nats_delivered_at = now()`, `message_id = @message_id`, pgx.NamedArgs{"message_id": owed})
	testenv.SetState(t, pool, table, `amqp_delivered_at = now()`, `message_id = @message_id`, pgx.NamedArgs{"message_id": owedAMQP})
	testenv.SetState(t, pool, table, `nats_delivered_at = now(), done_at = now()`, `message_id = @message_id`, pgx.NamedArgs{"message_id": owedDone})
	want := map[string]skip{
		confirmed: skipDelivered, upper: skipDelivered, natsOnly: send, owed: skipOwed, owedAMQP: skipOwed,
		owedDone: send, outbox: skipOwed, fresh: send, "legacy-1": skipBackfilled, "legacy-2": send,
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

// The lookups stay on the message_id indexes, the delivered one partial
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
	ids := []string{uuid.NewString()}
	for name, stmt := range map[string]struct {
		sql    string
		params any
	}{
		"ReplayDelivered": {q.ReplayDelivered, outboxsql.ReplayDeliveredParams{UUIDs: ids}},
		"ReplayOwed":      {q.ReplayOwed, outboxsql.ReplayOwedParams{UUIDs: ids}},
	} {
		var plan strings.Builder
		rows, err := tx.Query(ctx, "EXPLAIN "+stmt.sql, pgx.StrictStructArgs(stmt.params))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			rows.Scan(&line) //nolint:errcheck // read below
			plan.WriteString(line + "\n")
		}
		rows.Close()
		indexes := []string{table.Name + "_delivered_message_id"}
		if name == "ReplayOwed" {
			indexes = []string{table.Name + "_message_id_key", table.Name + "_owed_message_id"}
		}
		for _, index := range indexes {
			if !strings.Contains(plan.String(), index) {
				t.Errorf("%s does not use %s:\n%s", name, index, plan.String())
			}
		}
	}
}

// A row the relays finish while a lookup runs leaves the outbox or the owed
// table for the delivered record in one commit: the lookup finds it in one
// or the other, never in neither (RabbitMQ would get it a second time). The
// test holds locks on both tables so the commit falls between the lookup's
// statements.
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
	// One row fresh in the outbox, one a batch left owed to RabbitMQ.
	fresh, owed := uuid.NewString(), uuid.NewString()
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (message_id, topic, payload) VALUES (@fresh, 't', ''), (@owed, 't', '')`, pgx.NamedArgs{"fresh": fresh, "owed": owed}); err != nil {
		t.Fatal(err)
	}
	testenv.SetState(t, pool, table, `nats_delivered_at = now()`, `message_id = @message_id`, pgx.NamedArgs{"message_id": owed})
	// The relay sends them to RabbitMQ and finishes them, under locks the
	// lookup waits for.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`LOCK TABLE ` + table.Ident() + `, ` + table.Owed() + ` IN ACCESS EXCLUSIVE MODE`, nil},
		{`WITH del AS (DELETE FROM ` + table.Ident() + ` WHERE message_id = @message_id RETURNING id, message_id)
			INSERT INTO ` + table.Delivered() + ` (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at)
			SELECT id, message_id, now(), now(), true, now() FROM del`, []any{pgx.NamedArgs{"message_id": fresh}}},
		{`WITH del AS (DELETE FROM ` + table.Owed() + ` WHERE message_id = @message_id RETURNING id, message_id, nats_delivered_at)
			INSERT INTO ` + table.Delivered() + ` (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at)
			SELECT id, message_id, now(), nats_delivered_at, true, now() FROM del`, []any{pgx.NamedArgs{"message_id": owed}}},
	} {
		if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	items := []item{{msg: &relay.Message{MessageID: fresh}}, {msg: &relay.Message{MessageID: owed}}}
	looked := make(chan error, 1)
	go func() { looked <- r.lookup(ctx, items) }()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation IN (@outbox_table::regclass, @owed_table::regclass) AND NOT granted)`,
			pgx.NamedArgs{"outbox_table": table.Ident(), "owed_table": table.Owed()}).Scan(&waiting)
		return err == nil && waiting
	}, "the lookup never waited for the tables' locks")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-looked; err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.skip != skipDelivered {
			t.Errorf("a row finished during the lookup: %q, want %q (RabbitMQ has it)", it.skip, skipDelivered)
		}
	}
}
