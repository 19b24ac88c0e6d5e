package backfill

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/time/rate"
)

// At a low --rate a batch waits for the limiter longer than its time to
// settle (the publish timeout and 10 s): that wait is not the publish's.
// When it was, every publish of such a batch failed before it was sent,
// and the run requeued the same messages for ever.
func TestProcessAtALowRate(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and NATS")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// 20 msg/s (bursts of 2): 224 messages wait 11.1 s, past 0.5 s + 10 s.
	b, st := processRunner(t, "bfrate", func(c *Config) { c.Rate, c.PublishTimeout = 20, 500*time.Millisecond })
	b.limiter = rate.NewLimiter(20, 2)
	id := st.Prefix[:len(st.Prefix)-1]
	var ds []amqp.Delivery
	for tag := uint64(1); tag <= 224; tag++ {
		ds = append(ds, amqp.Delivery{DeliveryTag: tag, MessageId: fmt.Sprintf("r-%s-%d", id, tag), RoutingKey: "orders", Body: []byte("x")})
	}
	rec := &recAck{}
	b.process(ctx, newAcker(rec), ds, nil, time.Now(), nil)
	if s := b.summary(); s.Moved != 224 || s.Requeued != 0 {
		t.Fatalf("moved %d, requeued %d; want all 224 moved", s.Moved, s.Requeued)
	}
	if want := []string{"ack 224 true"}; !reflect.DeepEqual(rec.calls, want) {
		t.Fatalf("frames sent to RabbitMQ: %v, want %v", rec.calls[:min(len(rec.calls), 5)], want)
	}
}

// A record of moved ids that fails is tried again before the acks: acked
// unrecorded, a message whose ack is then lost comes back and is published
// again (after JetStream's duplicate window, a second copy in the stream).
func TestProcessRecordsThroughAPostgresBlip(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and NATS")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, st := processRunner(t, "bfrec", func(*Config) {})
	pool, table := b.cfg.DB, b.cfg.Table
	// The record fails while the table refuse holds a row.
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table.Schema+`.refuse (x int);
INSERT INTO `+table.Schema+`.refuse VALUES (1);
CREATE FUNCTION `+table.Schema+`.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT FROM `+table.Schema+`.refuse) THEN RAISE EXCEPTION 'test: record refused'; END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER refuse AFTER INSERT ON `+table.Backfilled()+` FOR EACH STATEMENT EXECUTE FUNCTION `+table.Schema+`.refuse();`); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(500*time.Millisecond, func() {
		if _, err := pool.Exec(context.Background(), `DELETE FROM `+table.Schema+`.refuse`); err != nil {
			t.Error(err)
		}
	})
	id := st.Prefix[:len(st.Prefix)-1]
	var ds []amqp.Delivery
	for tag := uint64(1); tag <= 50; tag++ {
		ds = append(ds, amqp.Delivery{DeliveryTag: tag, MessageId: fmt.Sprintf("b-%s-%d", id, tag), RoutingKey: "orders", Body: []byte("x")})
	}
	rec := &recAck{}
	b.process(ctx, newAcker(rec), ds, nil, time.Now(), nil)
	if want := []string{"ack 50 true"}; !reflect.DeepEqual(rec.calls, want) {
		t.Fatalf("frames sent to RabbitMQ: %v, want %v", rec.calls[:min(len(rec.calls), 5)], want)
	}
	var recorded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table.Backfilled()).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded != 50 {
		t.Fatalf("%d of 50 moved ids recorded before their acks, want all", recorded)
	}
}

// Ids JetStream already held (within its duplicate window) are moved — acked
// and recorded, the stream keeping its one copy — and counted apart, so that
// a run shows them (two legacy messages sharing an id keep only the first).
func TestProcessCountsDuplicates(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and NATS")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, st := processRunner(t, "bfdup", func(*Config) {})
	id := st.Prefix[:len(st.Prefix)-1]
	var ds []amqp.Delivery
	for tag := uint64(1); tag <= 30; tag++ {
		msgID := fmt.Sprintf("d-%s-%d", id, tag)
		ds = append(ds, amqp.Delivery{DeliveryTag: tag, MessageId: msgID, RoutingKey: "orders", Body: []byte("x")})
		if tag <= 10 { // published before, by someone else
			m := nats.NewMsg(st.Prefix + "orders")
			m.Header.Set(jetstream.MsgIDHeader, msgID)
			m.Data = []byte("earlier")
			if _, err := st.JS.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec := &recAck{}
	b.process(ctx, newAcker(rec), ds, nil, time.Now(), nil)
	if s := b.summary(); s.Moved != 30 || s.Duplicates != 10 {
		t.Fatalf("moved %d, duplicates %d; want 30 and 10", s.Moved, s.Duplicates)
	}
	info, err := st.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 30 {
		t.Fatalf("stream holds %d messages, want 30", info.State.Msgs)
	}
}
