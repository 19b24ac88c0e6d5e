package replay

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

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
