package backfill

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/internal/testenv"
)

// processRunner is a runner for process() alone, on Postgres and a stream
// of the test's own (no RabbitMQ: the test hands it deliveries), its Config
// as tune leaves it.
func processRunner(t *testing.T, prefix string, tune func(*Config)) (*runner, *testenv.Stream) {
	t.Helper()
	pool := testenv.Pool(t)
	st := testenv.NewStream(t, prefix)
	cfg := Config{AMQPURL: "amqp://unused", Queue: "unused", NATS: st.NC, Stream: st.Name,
		SubjectPrefix: st.Prefix, DB: pool, Table: testenv.Outbox(t, pool)}
	tune(&cfg)
	if err := cfg.applyDefaults(); err != nil {
		t.Fatal(err)
	}
	return &runner{cfg: cfg, log: cfg.Logger, js: st.JS, pub: jspub.New(st.NC, st.Name, 2*cfg.Prefetch, cfg.PublishTimeout),
		seenHeld: map[string]bool{}, retrying: map[string]int{}}, st
}

// A batch is settled on RabbitMQ with one multiple-ack, whether its
// messages were moved or already known: one frame, not one per message.
func TestProcessAcksABatchWithOneFrame(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and NATS")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, st := processRunner(t, "bfp", func(*Config) {})
	pool, table := b.cfg.DB, b.cfg.Table
	id := st.Prefix[:len(st.Prefix)-1]

	// 100 deliveries; every fifth was moved by an earlier run.
	var ds []amqp.Delivery
	var known []string
	for tag := uint64(1); tag <= 100; tag++ {
		msgID := fmt.Sprintf("m-%s-%d", id, tag)
		ds = append(ds, amqp.Delivery{DeliveryTag: tag, MessageId: msgID, RoutingKey: "orders", Body: []byte("x")})
		if tag%5 == 0 {
			known = append(known, msgID)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Backfilled()+` (message_id, queue, derived)
SELECT id, 'q', false FROM unnest(@known::text[]) AS id`, pgx.NamedArgs{"known": known}); err != nil {
		t.Fatal(err)
	}

	rec := &recAck{}
	b.process(ctx, newAcker(rec), ds, nil, time.Now(), nil)

	if want := []string{"ack 100 true"}; !reflect.DeepEqual(rec.calls, want) {
		t.Fatalf("frames sent to RabbitMQ: %d %v, want %v", len(rec.calls), rec.calls[:min(len(rec.calls), 5)], want)
	}
	if s := b.summary(); s.Moved != 80 || s.AlreadyDelivered != 20 {
		t.Fatalf("moved %d, already delivered %d; want 80 and 20", s.Moved, s.AlreadyDelivered)
	}
	info, err := st.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 80 {
		t.Fatalf("stream holds %d messages, want 80", info.State.Msgs)
	}
}

// A batch waiting for a slot while the others are busy trying theirs (a
// JetStream that does not answer) gives up at its time — retryInPlace after
// it came — and goes back to the queue untried, as it does at once when
// the run stops: it does not wait on past RabbitMQ's consumer_timeout for a
// slot, nor make the stop wait for a try of its own.
func TestProcessWaitingForASlotGivesUpAtItsTime(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and NATS")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, st := processRunner(t, "bfslot", func(c *Config) { c.test.retryInPlace = 300 * time.Millisecond })
	retryInPlace := b.cfg.test.retryInPlace
	slots := make(chan struct{}, 1)
	slots <- struct{}{} // the one slot is busy
	id := st.Prefix[:len(st.Prefix)-1]
	ds := []amqp.Delivery{
		{DeliveryTag: 1, MessageId: "s-" + id + "-1", RoutingKey: "orders", Body: []byte("x")},
		{DeliveryTag: 2, MessageId: "s-" + id + "-2", RoutingKey: "orders", Body: []byte("x")},
	}
	rec := &recAck{}
	start := time.Now()
	b.process(ctx, newAcker(rec), ds, nil, start, slots)
	if took := time.Since(start); took < retryInPlace || took > 5*time.Second {
		t.Fatalf("gave up after %v, want at its time (%v)", took, retryInPlace)
	}
	if want := []string{"nack 1 false true", "nack 2 false true"}; !reflect.DeepEqual(rec.calls, want) {
		t.Fatalf("frames sent to RabbitMQ: %v, want %v", rec.calls, want)
	}

	stopped, stop := context.WithCancel(ctx)
	stop()
	rec = &recAck{}
	start = time.Now()
	b.process(stopped, newAcker(rec), ds, nil, start, slots)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("a stopped run's batch waited %v for a slot", took)
	}
	if want := []string{"nack 1 false true", "nack 2 false true"}; !reflect.DeepEqual(rec.calls, want) {
		t.Fatalf("stopped: frames sent to RabbitMQ: %v, want %v", rec.calls, want)
	}
	info, err := st.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("stream holds %d messages, want none: nothing was tried", info.State.Msgs)
	}
}
