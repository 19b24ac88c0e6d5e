package replay

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// A batch a relay claimed in the nats-only phase, still in flight when its
// relay already reports the new phase, finishes its rows on JetStream only:
// its message reaches the stream after the window's end was read, or its row
// is still in the outbox (owed) when looked up. The run waits for the
// batches claimed before it started, so the message is in the window.
func TestRunWaitsForBatchesClaimedBeforeIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	s := testenv.NewStream(t, "replayclaim")
	publish := func(id string) {
		m := &nats.Msg{Subject: s.Prefix + "orders.a", Data: []byte("x"), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
		if _, err := s.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("m-1")
	inFlight := uuid.NewString()
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (message_id, topic, payload) VALUES (@message_id, 'orders.a', 'x')`, pgx.NamedArgs{"message_id": inFlight}); err != nil {
		t.Fatal(err)
	}
	// The relay's batch: the row claimed, then published, then finished.
	batch, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := batch.Exec(ctx, `SELECT id FROM `+table.Ident()+` WHERE message_id = @message_id FOR UPDATE`, pgx.NamedArgs{"message_id": inFlight}); err != nil {
		t.Fatal(err)
	}

	logged := &testenv.SyncBuffer{}
	sink := &confirmAll{}
	type result struct {
		sum Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := Run(ctx, Config{DB: pool, Table: table, JS: s.JS, Stream: s.Name, SubjectPrefix: s.Prefix,
			Sink: sink, Exchange: "x", Request: Request{FromSeq: 1}, Logger: slog.New(slog.NewTextHandler(logged, nil))})
		done <- result{sum, err}
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return strings.Contains(logged.String(), "waiting for") }, "the run did not wait for the batch in flight")
	publish(inFlight)
	if _, err := batch.Exec(ctx, `WITH del AS (DELETE FROM `+table.Ident()+` WHERE message_id = @message_id RETURNING id, message_id)
		INSERT INTO `+table.Delivered()+` (id, message_id, nats_delivered_at, amqp_sent, done_at) SELECT id, message_id, now(), false, now() FROM del`, pgx.NamedArgs{"message_id": inFlight}); err != nil {
		t.Fatal(err)
	}
	if err := batch.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("Run: %v", res.err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if !res.sum.Finished || res.sum.Sent != 2 || !slices.Contains(sink.ids, inFlight) {
		t.Errorf("finished %v, %d sent (%v); want both messages, %s among them", res.sum.Finished, res.sum.Sent, sink.ids, inFlight)
	}
}
