package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/testenv"
)

// Dual-read consumers end to end: two relayd processes (one SIGKILLed
// mid-run, so RabbitMQ may get repeats) publish about 20,000 committed rows
// to both brokers, and `relayd backfill` moves 2,000 legacy messages (half
// without a message-id) from the queue into the stream, while two consumer
// instances each read the queue and a durable JetStream consumer through
// one inbox. Every message's side effect happens exactly once; rolled-back
// rows never; every delivery is acked.
func TestInboxDualReadThroughRelayKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	inboxTable := e.table.Schema + ".inbox"
	side := `"` + e.table.Schema + `".side_effects`
	db := stdlib.OpenDBFromPool(e.pool)
	if err := inbox.Migrate(ctx, db, inboxTable); err != nil {
		t.Fatalf("migrate inbox: %v", err)
	}
	db.Close()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+side+` (message_id text NOT NULL, source text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
		Durable: "inbox", AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}

	var calls atomic.Int64
	handle := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO `+side+` (message_id, source) VALUES ($1, $2)`, m.ID, m.Source)
		return err
	}
	reg := prometheus.NewRegistry()
	newInbox := func() *inbox.Inbox {
		in, err := inbox.New(e.pool, inbox.Config{Table: inboxTable, Consumer: "it", Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}

	// Two consumer instances, each reading both brokers.
	var stops []func()
	for i := range 2 {
		in := newInbox()
		conn, err := amqp.Dial(e.amqpURL)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Qos(200, 0, false); err != nil {
			t.Fatal(err)
		}
		tag := "inbox-" + string(rune('a'+i))
		deliveries, err := ch.Consume(e.queue, tag, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		amqpDone := make(chan struct{})
		go func() {
			defer close(amqpDone)
			for d := range deliveries {
				if err := in.HandleAMQP(ctx, d, handle); err != nil {
					t.Errorf("HandleAMQP: %v", err)
				}
			}
		}()
		nc, err := nats.Connect(e.natsURL)
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := js.Consumer(ctx, e.stream, "inbox")
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			if err := in.HandleJetStream(ctx, msg, handle); err != nil {
				t.Errorf("HandleJetStream: %v", err)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		// Soft stop: stop receiving, finish what was received, then close.
		stops = append(stops, func() {
			cc.Stop()
			<-cc.Closed()
			nc.Close()
			if err := ch.Cancel(tag, false); err != nil {
				t.Errorf("cancel consumer: %v", err)
			}
			<-amqpDone
			ch.Close()
			conn.Close()
		})
	}
	stopConsumers := sync.OnceFunc(func() {
		for _, stop := range stops {
			stop()
		}
	})
	t.Cleanup(stopConsumers)

	// Legacy producers' messages, some without a message-id, sit in the
	// queue; the backfill moves them into the stream while the consumers
	// read both brokers, so each may arrive twice.
	legacyIDs := map[string]bool{}
	var legacy []amqp.Publishing
	for i := range 2000 {
		p := amqp.Publishing{Body: []byte(fmt.Sprintf("legacy %d", i)), DeliveryMode: amqp.Persistent}
		if i%2 == 0 {
			p.MessageId = fmt.Sprintf("legacy-%04d", i)
			legacyIDs[p.MessageId] = true
		} else {
			legacyIDs[inbox.AMQPMessage(amqp.Delivery{RoutingKey: "orders.legacy", Body: p.Body}).ID] = true
		}
		legacy = append(legacy, p)
	}
	e.legacyPublish(legacy, "orders.legacy")

	r1 := e.startRelay("relay-1")
	e.startRelay("relay-2")
	var committed map[string]bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		// 25,000 rows, a fifth rolled back: about 20,000 dual-written.
		committed, _ = e.producers(ctx, 4, 25_000, time.Millisecond)
	}()
	out, err := e.backfillCmd("--allow-other-consumers").CombinedOutput()
	if err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	t.Logf("backfill alongside the dual-read consumers: %+v", decodeSummary(t, out))
	testenv.Eventually(t, time.Minute, func() bool { _, _, n := e.counts(); return n > 4000 }, "no progress before kill")
	r1.kill()
	<-done
	e.waitDelivered(2 * time.Minute)
	produced := len(committed)
	for id := range legacyIDs {
		committed[id] = true
	}
	if produced < 19_000 || len(committed) != produced+2000 {
		t.Fatalf("%d rows committed and %d legacy messages: want about 20,000 and 2,000", produced, len(committed)-produced)
	}

	processed := func() int {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM `+side).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 2*time.Minute, func() bool { return processed() == len(committed) }, "consumers did not process every committed row")
	testenv.Eventually(t, 30*time.Second, func() bool {
		info, err := e.js.Consumer(ctx, e.stream, "inbox")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci.NumPending == 0 && ci.NumAckPending == 0
	}, "JetStream consumer has pending or unacked messages")
	stopConsumers()

	// Anything still in the queue (repeats RabbitMQ had not delivered yet)
	// must be a duplicate, acked without running the handler.
	callsBefore := calls.Load()
	in := newInbox()
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	leftover := 0
	for {
		d, ok, err := ch.Get(e.queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		leftover++
		if err := in.HandleAMQP(ctx, d, handle); err != nil {
			t.Fatal(err)
		}
	}
	q, err := ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	if q.Messages != 0 || q.Consumers != 0 {
		t.Errorf("queue after the drain: %d messages, %d consumers; want empty", q.Messages, q.Consumers)
	}
	if calls.Load() != callsBefore {
		t.Errorf("draining %d leftover deliveries ran the handler %d times, want 0", leftover, calls.Load()-callsBefore)
	}

	// Exactly once per committed row, nothing for rolled-back rows.
	rows, err := e.pool.Query(ctx, `SELECT message_id, count(*) FROM `+side+` GROUP BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		seen[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	twice, extra := 0, 0
	for id, n := range seen {
		if !committed[id] {
			extra++
		} else if n != 1 {
			twice++
		}
	}
	if len(seen) != len(committed) || twice > 0 || extra > 0 || calls.Load() != int64(len(committed)) {
		t.Errorf("%d committed rows: side effects for %d ids, %d more than once, %d not committed; handler calls %d",
			len(committed), len(seen), twice, extra, calls.Load())
	}
	sum := func(name string) (amqpN, natsN float64) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == inbox.SourceAMQP {
					amqpN += m.GetCounter().GetValue()
				} else {
					natsN += m.GetCounter().GetValue()
				}
			}
		}
		return amqpN, natsN
	}
	pa, pn := sum("relayd_inbox_processed_total")
	da, dn := sum("relayd_inbox_duplicates_total")
	t.Logf("%d messages: processed first from amqp %v, nats %v; duplicates suppressed amqp %v, nats %v (left in the queue at the end: %d)",
		len(committed), pa, pn, da, dn, leftover)
}
