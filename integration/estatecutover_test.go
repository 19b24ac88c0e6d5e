package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/testenv"
)

// groupService is one consumer group of the estate: its legacy queue, its
// durable JetStream consumer, and the effects it records per message id.
type groupService struct {
	e        *env
	name     string // the durable consumer, and the group's name
	topic    string // its producers' topic; its queue binds topic.#
	queue    string
	effects  string // table: message_id, n (times processed)
	in       *inbox.Inbox
	legacy   *amqp.Channel
	drained  chan struct{} // closed once the legacy side has settled its last delivery
	jsSide   jetstream.ConsumeContext
	consumer jetstream.Consumer
}

func (e *env) newGroupService(name, topic string, withInbox bool) *groupService {
	t, ctx := e.t, context.Background()
	g := &groupService{e: e, name: name, topic: topic, queue: e.queue + "_" + name, effects: e.table.Schema + ".effects_" + name}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(g.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(g.queue, topic+".#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(e.amqpURL); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(g.queue, false, false, false) //nolint:errcheck // cleanup
			}
			c.Close()
		}
	})
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+g.effects+` (message_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if withInbox {
		db := stdlib.OpenDBFromPool(e.pool)
		defer db.Close()
		table := e.table.Schema + ".inbox_" + name
		if err := inbox.Migrate(ctx, db, table); err != nil {
			t.Fatal(err)
		}
		if g.in, err = inbox.New(e.pool, inbox.Config{Table: table, Consumer: name}); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// startLegacy consumes the group's queue: through the inbox, or (no inbox)
// processing each delivery and acking it.
func (g *groupService) startLegacy() {
	t, ctx := g.e.t, context.Background()
	ch, err := g.e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(20, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(g.queue, g.name+"-legacy", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.legacy, g.drained = ch, make(chan struct{})
	// Four at a time, as a service's handlers would: one alone falls behind
	// the producers on a loaded machine.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range ds {
				if g.in != nil {
					g.in.HandleAMQP(ctx, d, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error { return g.effectTx(ctx, tx, m.ID) }) //nolint:errcheck // acks, requeues or rejects
					continue
				}
				if err := g.effectTx(ctx, nil, d.MessageId); err != nil {
					d.Nack(false, true) //nolint:errcheck // redelivered
					continue
				}
				d.Ack(false) //nolint:errcheck // a lost ack redelivers, counted twice: the test would see it
			}
		}()
	}
	go func() { wg.Wait(); close(g.drained) }()
}

// stopLegacy stops the legacy side as a service would: no new deliveries,
// and those it has are processed and acked before the channel closes.
func (g *groupService) stopLegacy() {
	if err := g.legacy.Cancel(g.name+"-legacy", false); err != nil {
		g.e.t.Fatal(err)
	}
	<-g.drained
	g.legacy.Close()
}

// effectTx records the effect in tx, or on the pool when tx is nil.
func (g *groupService) effectTx(ctx context.Context, tx pgx.Tx, id string) error {
	sql := `INSERT INTO ` + g.effects + ` (message_id, n) VALUES ($1, 1) ON CONFLICT (message_id) DO UPDATE SET n = ` + g.effects + `.n + 1`
	if tx != nil {
		_, err := tx.Exec(ctx, sql, id)
		return err
	}
	_, err := g.e.pool.Exec(ctx, sql, id)
	return err
}

// createConsumer creates the group's durable consumer on its subjects.
func (g *groupService) createConsumer(deliver jetstream.DeliverPolicy) {
	t, ctx := g.e.t, context.Background()
	st, err := g.e.js.Stream(ctx, g.e.stream)
	if err != nil {
		t.Fatal(err)
	}
	g.consumer, err = st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: g.name, FilterSubject: g.e.prefix + g.topic + ".>",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, DeliverPolicy: deliver})
	if err != nil {
		t.Fatal(err)
	}
}

// startJetStream consumes the group's durable consumer.
func (g *groupService) startJetStream() {
	t, ctx := g.e.t, context.Background()
	cc, err := g.consumer.Consume(func(m jetstream.Msg) {
		if g.in != nil {
			g.in.HandleJetStream(ctx, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error { return g.effectTx(ctx, tx, m.ID) }) //nolint:errcheck // acks or naks
			return
		}
		if err := g.effectTx(ctx, nil, m.Headers().Get("Nats-Msg-Id")); err != nil {
			m.Nak() //nolint:errcheck // redelivered
			return
		}
		m.DoubleAck(ctx) //nolint:errcheck // a lost ack redelivers, counted twice: the test would see it
	})
	if err != nil {
		t.Fatal(err)
	}
	g.jsSide = cc
	t.Cleanup(cc.Stop)
}

// An estate's cutover under producer load that never stops: three consumer
// groups on three legacy queues of one exchange, billing and shipping dual
// reading through the inbox, ledger on the rolling upgrade. phase set nats is
// refused while ledger still reads its queue, naming it; each group then
// moves on its own check; phase set nats passes without --force while the
// producers write, and every message is processed once by each group.
func TestEstateCutover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	billing := e.newGroupService("billing", "billing", true)
	shipping := e.newGroupService("shipping", "shipping", true)
	ledger := e.newGroupService("ledger", "ledger", false)

	if code, out, errOut := e.relayd("phase", "set", "dual", "--reason", "dual write"); code != 0 {
		t.Fatalf("phase set dual: exit %d\n%s%s", code, out, errOut)
	}
	e.startRelay("relay")
	loads := map[*groupService]*loadGen{}
	for _, g := range []*groupService{billing, shipping, ledger} {
		// ~20 rows/s each: a legacy side processing one at a time through the
		// inbox keeps up with it on a loaded machine.
		loads[g] = e.startTopicLoad(g.topic+".event", 1, 50*time.Millisecond)
		g.startLegacy()
	}
	for _, g := range []*groupService{billing, shipping} {
		g.createConsumer(jetstream.DeliverAllPolicy)
		g.startJetStream()
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return len(e.idCounts(ledger.effects)) > 50 && len(e.idCounts(billing.effects)) > 50 }, "the groups processed nothing")
	// A durable consumer that is no group's: an analytics export, say.
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "audit", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}

	// phase set nats with every group: ledger still reads its queue and has
	// no JetStream consumer yet, and audit is no group, so it is refused,
	// naming each and why.
	all := []string{"--dual-read", "billing:" + billing.queue, "--dual-read", "shipping:" + shipping.queue, "--rolling-upgrade", "ledger:" + ledger.queue}
	code, out, errOut := e.relayd(append([]string{"phase", "set", "nats", "--quiet-period", "2s"}, all...)...)
	if code != 1 || !strings.Contains(errOut, "refused, nothing recorded") || !strings.Contains(errOut, `condition "legacy queue" of group ledger`) ||
		!strings.Contains(errOut, "consumer ledger does not exist") || !strings.Contains(errOut, e.stream+"/audit") {
		t.Fatalf("phase set nats with ledger on its queue and audit unnamed: exit %d; want 1, refused naming group ledger's queue and consumer, and audit:\n%s%s", code, out, errOut)
	}
	t.Logf("phase set nats, ledger not moved (exit %d):\n%s%s", code, out, errOut)

	// billing moves: its own check, under load, then its legacy side stops.
	// Its queue stays bound (deleting it would make its rows unroutable to the
	// relay in dual write); it fills with copies nobody reads.
	check := func(group ...string) {
		t.Helper()
		code, out, errOut := e.relayd(append([]string{"cutover", "check", "--quiet-period", "2s", "--wait", "--timeout", "90s"}, group...)...)
		if code != 0 || !strings.Contains(out, "READY") {
			t.Fatalf("cutover check %v: exit %d, want 0 and READY:\n%s%s", group, code, out, errOut)
		}
		t.Logf("cutover check %v:\n%s", group, out)
	}
	check("--dual-read", "billing:"+billing.queue)
	billing.stopLegacy()

	// ledger moves on the rolling upgrade: its publishers pause, its old
	// consumers drain the queue and stop, the new consumer starts from now.
	loads[ledger].pause()
	testenv.Eventually(t, 60*time.Second, func() bool {
		var owed int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+pending(e.table)+` WHERE topic LIKE 'ledger.%' AND (amqp_delivered_at IS NULL OR nats_delivered_at IS NULL)`).Scan(&owed)
		n, _ := e.queueDepth(ledger.queue)
		return owed == 0 && n == 0
	}, "ledger's rows were not relayed and drained")
	ledger.stopLegacy()
	ledger.createConsumer(jetstream.DeliverNewPolicy)
	check("--rolling-upgrade", "ledger:"+ledger.queue)
	ledger.startJetStream()
	loads[ledger].paused.Store(false)

	// The table moves, with every producer writing: billing and ledger have
	// moved (named without their queues), shipping still reads both, audit
	// is excluded.
	code, out, errOut = e.relayd("phase", "set", "nats", "--reason", "estate cutover", "--wait", "--timeout", "90s",
		"--dual-read", "billing", "--dual-read", "shipping:"+shipping.queue, "--rolling-upgrade", "ledger", "--exclude", "audit")
	if code != 0 || !strings.Contains(out, "phase dual -> nats") || strings.Contains(out, "forced") {
		t.Fatalf("phase set nats with every group ready: exit %d; want 0, not forced:\n%s%s", code, out, errOut)
	}
	t.Logf("phase set nats:\n%s", out)
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Delivered()+` WHERE amqp_delivered_at IS NULL AND nats_delivered_at IS NOT NULL`).Scan(&n)
		return n > 50
	}, "no rows relayed in phase nats")

	// shipping drops its legacy side after the move, on its own check.
	check("--dual-read", "shipping:"+shipping.queue)
	shipping.stopLegacy()

	// Every message of each group's topic processed once by that group.
	for _, g := range []*groupService{billing, shipping, ledger} {
		ids := loads[g].halt()
		testenv.Eventually(t, 90*time.Second, func() bool {
			ci, err := g.consumer.Info(ctx)
			return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && len(e.idCounts(g.effects)) >= len(ids)
		}, "group %s did not process its %d messages", g.name, len(ids))
		done := e.idCounts(g.effects)
		for _, id := range ids {
			if done[id] != 1 {
				t.Fatalf("group %s processed message %s %d times, want once", g.name, id, done[id])
			}
		}
		if len(done) != len(ids) {
			t.Fatalf("group %s processed %d messages, its producers wrote %d", g.name, len(done), len(ids))
		}
		t.Logf("group %s: %d messages, each processed once", g.name, len(ids))
	}
}
