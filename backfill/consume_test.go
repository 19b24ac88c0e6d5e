package backfill

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// At the default prefetch, every parallel batch can be full while RabbitMQ
// delivers the next: the pipeline is bounded by the batches, not starved by
// the prefetch. The run is slowed by Rate, so batches queue up behind it and
// the run shows the most it can hold: a rate well below what RabbitMQ
// delivers on a loaded machine (at 8,000/s, on a slow day under the race
// detector, deliveries never piled up past 993). With the old default (1,000 unacked)
// at most 1,000 deliveries were ever ours: fewer than parallel × batchMax.
func TestDefaultPrefetchFillsEveryBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ, Postgres and NATS")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	st := testenv.NewStream(t, "bfpf")
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := testenv.Name("bfpf")
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const n = 4000
	var dcs []*amqp.DeferredConfirmation
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("%s-%d", queue, i), Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		dcs = append(dcs, dc)
	}
	for _, dc := range dcs {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish to the queue: ok %v, %v", ok, err)
		}
	}

	var peak atomic.Int64
	cfg := Config{AMQPURL: testenv.AMQPURL(t), Queue: queue, NATS: st.NC, Stream: st.Name,
		SubjectPrefix: st.Prefix, DB: pool, Table: table, Rate: 2000}
	cfg.test.onFlush = func(inFlight int64) {
		for p := peak.Load(); inFlight > p && !peak.CompareAndSwap(p, inFlight); p = peak.Load() {
		}
	}

	sum, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Moved != n {
		t.Fatalf("moved %d of %d: %+v", sum.Moved, n, sum)
	}
	info, err := st.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, n)
	}
	if got, want := peak.Load(), int64(parallel*batchMax); got <= want {
		t.Fatalf("at most %d deliveries were ours at once; the default prefetch (%d) must let %d batches of %d be in flight with one more filling (more than %d)",
			got, DefaultPrefetch, parallel, batchMax, want)
	}
}
