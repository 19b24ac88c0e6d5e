package cutover_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/testenv"
)

// Each condition, broken on its own, fails the check naming it; with all
// clear the check passes.
func TestCheckNamesEachFailingCondition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)

	ns := testenv.NewStream(t, "co")
	js, st := ns.JS, ns.Stream
	id, stream := ns.Prefix[:len(ns.Prefix)-1], ns.Name
	subject := id + ".orders"
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "new-side", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}

	amqpURL := testenv.AMQPURL(t)
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := testenv.Queue(t, id+"_legacy")

	cfg := cutover.Config{DB: pool, Table: table, JS: js, AMQPURL: amqpURL, Poll: 100 * time.Millisecond,
		Groups: []cutover.Group{{Stream: stream, Consumer: "new-side", Queue: queue, Path: cutover.RollingUpgrade}}}
	check := func(wantOK bool, wantFail, wantDetail string) cutover.Result {
		t.Helper()
		res, err := cutover.Check(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.OK != wantOK {
			t.Fatalf("check OK = %v, want %v: %+v", res.OK, wantOK, res.Conditions)
		}
		if wantFail != "" {
			var failed []string
			for _, c := range res.Conditions {
				if !c.OK && !strings.HasPrefix(c.Detail, "not watched") {
					failed = append(failed, c.Name)
					if c.Name == wantFail && !strings.Contains(c.Detail, wantDetail) {
						t.Fatalf("%s failed with %q, want it to say %q", c.Name, c.Detail, wantDetail)
					}
				}
			}
			if len(failed) != 1 || failed[0] != wantFail {
				t.Fatalf("failed conditions %v, want exactly [%s]: %+v", failed, wantFail, res.Conditions)
			}
		}
		return res
	}

	// All clear; the quiet interval defaults to the consumer's AckWait.
	if res := check(true, "", ""); res.QuietPeriod != time.Second {
		t.Fatalf("quiet period %v, want the consumer's AckWait (1s)", res.QuietPeriod)
	}

	// 1. A row pending for nats since before the quiet interval: it may be
	// the group's, and would reach the new consumer after the old ones.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.x', '\x00')`); err != nil {
		t.Fatal(err)
	}
	check(false, cutover.CondQuiet, "a row owed to JetStream since before the quiet interval")
	// Owed for longer than the relays ever take: the outbox condition.
	if _, err := pool.Exec(ctx, `UPDATE `+table.Ident()+` SET created_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	check(false, cutover.CondOutbox, "the relays are 30s or more behind")
	// Still owed once a batch left it owed to nats only.
	testenv.SetState(t, pool, table, `amqp_delivered_at = now()`, `true`)
	check(false, cutover.CondOutbox, "the relays are 30s or more behind")
	testenv.SetState(t, pool, table, `nats_delivered_at = now(), done_at = now()`, `true`)

	// 1a. Owed to RabbitMQ only, since before the quiet interval: it would
	// reach the queue after the old consumers stopped.
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders.y', '\x00')`); err != nil {
		t.Fatal(err)
	}
	testenv.SetState(t, pool, table, `nats_delivered_at = now()`, `true`)
	check(false, cutover.CondQuiet, "rows owed to RabbitMQ since before the quiet interval")
	testenv.SetState(t, pool, table, `amqp_delivered_at = now(), done_at = now()`, `true`)

	// 1b. Rows finished without JetStream lately: from before dual write
	// (before the first row JetStream got), fine; after it (an instance
	// running RELAY_TARGETS=amqp), never pending for nats, and caught here.
	delivered := func(id int, ago string, nats bool) {
		t.Helper()
		natsAt := "NULL"
		if nats {
			natsAt = "now() - interval '" + ago + "'"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+table.Delivered()+` (done_at, id, message_id, amqp_delivered_at, nats_delivered_at)
			VALUES (now() - $1::interval, $2, gen_random_uuid(), now(), `+natsAt+`)`, ago, id); err != nil {
			t.Fatal(err)
		}
	}
	delivered(1000, "10 minutes", false) // legacy only, then dual write
	delivered(1001, "5 minutes", true)
	check(true, "", "")
	delivered(1002, "1 minute", false) // an instance still legacy only
	check(false, cutover.CondOutbox, "1 rows finished in the last 15m0s without JetStream")
	if _, err := pool.Exec(ctx, `UPDATE `+table.Delivered()+` SET nats_delivered_at = now() WHERE id = 1002`); err != nil {
		t.Fatal(err)
	}

	// 2. The legacy queue not empty.
	if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		q, _ := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return q.Messages == 1
	}, "message not in the queue")
	check(false, cutover.CondQueue, "1 ready")
	if _, err := ch.QueuePurge(queue, false); err != nil {
		t.Fatal(err)
	}

	// 3. A legacy consumer still attached.
	lc, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Consume(queue, "legacy", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	check(false, cutover.CondQueue, "1 consumers")
	lc.Close()

	// 4. The durable consumer has a message pending.
	if _, err := js.Publish(ctx, subject, []byte("1")); err != nil {
		t.Fatal(err)
	}
	check(false, cutover.CondConsumer, "pending 1")

	// 5. Delivered but not acked.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held jetstream.Msg
	for m := range batch.Messages() {
		held = m
	}
	if held == nil {
		t.Fatal("no message fetched")
	}
	check(false, cutover.CondConsumer, "ack pending 1")
	if err := held.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	check(true, "", "")

	// 6. A publish during the quiet interval (consumed and acked at once, so
	// only the consumer's delivered sequence gives it away).
	cfg.QuietPeriod = 3 * time.Second
	cc, err := cons.Consume(func(m jetstream.Msg) { m.Ack() })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	var once sync.Once
	cfg.OnSample = func(time.Duration, time.Duration) {
		once.Do(func() { js.Publish(context.Background(), subject, []byte("2")) }) //nolint:errcheck // the check sees it
	}
	check(false, cutover.CondQuiet, "its subjects are not quiet")
	cfg.OnSample = nil
	testenv.Eventually(t, 5*time.Second, func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	}, "consumer did not catch up")

	// All clear again: passes, with the conservative interval computed.
	cfg.QuietPeriod = 0
	check(true, "", "")
	cfg.Conservative = true
	cfg.QuietPeriod = 0
	// AckWait 1s x (MaxAckPending 1000 + 1) is long; only check the figure.
	cfg.Poll = time.Hour
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	res, _ := cutover.Check(cctx, cfg)
	if res.QuietPeriod != 1001*time.Second {
		t.Fatalf("conservative quiet period %v, want AckWait x (MaxAckPending+1) = 1001s", res.QuietPeriod)
	}
}

// --conservative waits AckWait × (MaxAckPending + 1); a consumer without an
// ack-pending limit (-1) has no such bound, and the check says so rather
// than watch for 0 s.
func TestConservativeNeedsAnAckPendingLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	ns := testenv.NewStream(t, "cons")
	if _, err := ns.Stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "unlimited", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, MaxAckPending: -1}); err != nil {
		t.Fatal(err)
	}
	cfg := cutover.Config{DB: pool, Table: table, JS: ns.JS, AMQPURL: testenv.AMQPURL(t), Poll: 100 * time.Millisecond, Conservative: true,
		Groups: []cutover.Group{{Stream: ns.Name, Consumer: "unlimited", Queue: testenv.Queue(t, strings.TrimSuffix(ns.Prefix, ".")+"_q"), Path: cutover.RollingUpgrade}}}
	res, err := cutover.Check(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "MaxAckPending") {
		t.Fatalf("Check = %+v, %v; want an error about MaxAckPending", res, err)
	}
	// With the interval given, the check runs.
	cfg.QuietPeriod = 300 * time.Millisecond
	if res, err := cutover.Check(ctx, cfg); err != nil || !res.OK || res.QuietPeriod != cfg.QuietPeriod {
		t.Fatalf("Check with a quiet period = %+v, %v; want OK over 300ms", res, err)
	}
}

// A consumer whose figures do not say what the application processed — one
// that does not ack, or an ephemeral one — fails the check, with a reason,
// however empty it looks.
func TestConsumerMustAckAndBeDurable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	ns := testenv.NewStream(t, "coack")
	if _, err := ns.Stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "no-acks", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Name: "ephemeral", AckPolicy: jetstream.AckExplicitPolicy, InactiveThreshold: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "good", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for consumer, want := range map[string]string{"no-acks": "does not ack", "ephemeral": "is not durable", "good": ""} {
		cfg := cutover.Config{DB: pool, Table: table, JS: ns.JS, Poll: 100 * time.Millisecond, QuietPeriod: 300 * time.Millisecond,
			Groups: []cutover.Group{{Stream: ns.Name, Consumer: consumer, Path: cutover.DualRead}}}
		res, err := cutover.Check(ctx, cfg)
		if err != nil {
			t.Fatalf("%s: %v", consumer, err)
		}
		if res.OK != (want == "") {
			t.Errorf("%s: OK = %v, want %v: %+v", consumer, res.OK, want == "", res)
		}
		for _, c := range res.Conditions {
			if c.Name == cutover.CondConsumer && (c.OK != (want == "") || !strings.Contains(c.Detail, want)) {
				t.Errorf("%s: consumer condition %+v, want OK %v and %q", consumer, c, want == "", want)
			}
		}
	}
}
