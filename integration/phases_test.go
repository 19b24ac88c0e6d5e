package integration

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// loadGen writes rows continuously until stopped; it can pause ("publishers
// idle") and resume. It keeps the ids it committed.
type loadGen struct {
	e      *env
	paused atomic.Bool
	write  sync.Mutex // held through each write: pause waits for the one in flight
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	ids    []string
	err    error
}

func (e *env) startLoad(perTick int, tick time.Duration) *loadGen {
	return e.startTopicLoad("orders.placed", perTick, tick)
}

// startTopicLoad is startLoad writing rows of topic.
func (e *env) startTopicLoad(topic string, perTick int, tick time.Duration) *loadGen {
	g := &loadGen{e: e, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		t := time.NewTicker(tick)
		defer t.Stop()
		n := 0
		for {
			select {
			case <-g.stop:
				return
			case <-t.C:
			}
			g.write.Lock()
			if g.paused.Load() {
				g.write.Unlock()
				continue
			}
			msgs := make([]outbox.Message, perTick)
			for i := range msgs {
				n++
				msgs[i] = outbox.Message{Topic: topic, Payload: []byte(fmt.Sprintf(`{"n":%d}`, n))}
			}
			ids, err := e.writer.Write(context.Background(), e.pool, msgs...)
			g.write.Unlock()
			if err != nil {
				g.mu.Lock()
				g.err = err
				g.mu.Unlock()
				return
			}
			g.mu.Lock()
			g.ids = append(g.ids, ids...)
			g.mu.Unlock()
		}
	}()
	return g
}

// pause stops the writes, and returns once the one in flight, if any, has
// committed: after it, no row of this load is still to come.
func (g *loadGen) pause() {
	g.paused.Store(true)
	g.write.Lock()
	defer g.write.Unlock()
}

func (g *loadGen) halt() []string {
	close(g.stop)
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		g.e.t.Fatalf("producer: %v", g.err)
	}
	return g.ids
}

// The whole migration under continuous producer load: phase 0 legacy only
// → 1 dual write (consumers read both brokers through the inbox) → 3 the
// legacy side stops → 2 backfill of what it left → cutover check → 4 new
// only. Every message produced during the run is processed exactly once by
// message id, and `relayd verify` passes at the end.
func TestMigrationPhases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	// The consumer service: an inbox and a side effect counted per id.
	inboxTable := e.table.Schema + ".inbox"
	db := stdlib.OpenDBFromPool(e.pool)
	defer db.Close()
	if err := inbox.Migrate(ctx, db, inboxTable); err != nil {
		t.Fatal(err)
	}
	effects := e.table.Schema + ".effects"
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+effects+` (message_id text PRIMARY KEY, n int NOT NULL, source text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(e.pool, inbox.Config{Table: inboxTable, Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	work := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (message_id, n, source) VALUES ($1, 1, $2)
			ON CONFLICT (message_id) DO UPDATE SET n = `+effects+`.n + 1`, m.ID, m.Source)
		return err
	}

	// Phase 0 — legacy only, with the legacy consumer.
	load := e.startLoad(5, 20*time.Millisecond) // ~250 rows/s
	relay := e.startRelay("relay-phase0", "RELAY_TARGETS=amqp")
	lch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := lch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := lch.Consume(e.queue, "legacy", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	legacyDone := make(chan struct{})
	go func() {
		defer close(legacyDone)
		for d := range deliveries {
			in.HandleAMQP(ctx, d, work)       //nolint:errcheck // acks, requeues or rejects; counted below
			time.Sleep(15 * time.Millisecond) // a legacy consumer slower than the producers: it leaves a backlog
		}
	}()
	countEffects := func() int {
		var n int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&n)
		return n
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return countEffects() > 100 }, "legacy consumer processed nothing in phase 0")

	// Phase 1 — dual write; the consumer service also reads JetStream.
	if code := relay.stop(30 * time.Second); code != 0 {
		t.Fatalf("relay exit %d", code)
	}
	relay = e.startRelay("relay-phase1", "RELAY_TARGETS=amqp,nats")
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	const durable = "billing"
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { in.HandleJetStream(ctx, m, work) }) //nolint:errcheck // acks or naks
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	testenv.Eventually(t, 30*time.Second, func() bool { _, _, n := e.counts(); return n > 500 }, "no dual write")

	// Phase 3 — the consumers' legacy side stops (the queue keeps filling:
	// RabbitMQ still gets every row).
	lch.Cancel("legacy", false)
	<-legacyDone
	lch.Close()

	// Phase 2 — backfill what the legacy side left in the queue: phase-0
	// rows it never got to are moved; dual-written ones are skipped.
	out, err := e.backfillCmd().CombinedOutput()
	if err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	sum := decodeSummary(t, out)
	t.Logf("backfill under load: %+v", sum)
	if sum.Moved == 0 || sum.AlreadyDelivered == 0 {
		t.Errorf("backfill moved %d and skipped %d: want phase-0 leftovers moved and dual-written ones skipped", sum.Moved, sum.AlreadyDelivered)
	}

	// Cutover — publishers idle, relay caught up, the queue drained again.
	load.paused.Store(true)
	testenv.Eventually(t, 60*time.Second, func() bool {
		var owed int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+pending(e.table)).Scan(&owed)
		return owed == 0
	}, "relay did not catch up with the producers paused")
	if out, err := e.backfillCmd().CombinedOutput(); err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	check := exec.Command(relaydBin, "cutover", "check", "--consumer", durable, "--queue", e.queue,
		"--quiet-period", "3s", "--wait", "--timeout", "90s")
	check.Env = e.relayEnv()
	out, err = check.CombinedOutput()
	if err != nil {
		t.Fatalf("cutover check: %v\n%s", err, out)
	}
	t.Logf("cutover check:\n%s", out)

	// Phase 4 — new only.
	if code := relay.stop(30 * time.Second); code != 0 {
		t.Fatalf("relay exit %d", code)
	}
	e.startRelay("relay-phase4", "RELAY_TARGETS=nats")
	load.paused.Store(false)
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Delivered()+` WHERE amqp_delivered_at IS NULL AND nats_delivered_at IS NOT NULL`).Scan(&n)
		return n > 200
	}, "no rows relayed in phase 4")
	ids := load.halt()

	// Everything produced is processed exactly once.
	testenv.Eventually(t, 60*time.Second, func() bool {
		var left int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+pending(e.table)+` WHERE nats_delivered_at IS NULL`).Scan(&left)
		ci, err := cons.Info(ctx)
		return left == 0 && err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && countEffects() >= len(ids)
	}, "consumers did not catch up")
	done := e.idCounts(effects)
	for _, id := range ids {
		if done[id] != 1 {
			t.Fatalf("message %s processed %d times, want exactly once", id, done[id])
		}
	}
	if len(done) != len(ids) {
		t.Fatalf("%d messages processed, %d produced", len(done), len(ids))
	}
	if n, _ := e.queueDepth(e.queue); n != 0 {
		t.Fatalf("legacy queue holds %d messages after phase 4", n)
	}
	verify := exec.Command(relaydBin, "verify", "--since", "1h")
	verify.Env = e.relayEnv()
	if out, err := verify.CombinedOutput(); err != nil {
		t.Fatalf("relayd verify: %v\n%s", err, out)
	}
	t.Logf("%d messages produced across the phases, each processed once", len(ids))
}
