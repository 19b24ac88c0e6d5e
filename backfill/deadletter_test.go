package backfill

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// A dead-letter publish that RabbitMQ returns (the queue is gone: deleted
// after the run checked it) fails, though RabbitMQ confirms it: acking the
// source on that confirm would lose the message. One to a queue that exists
// succeeds, a stale return of an earlier publish notwithstanding.
func TestDeadLetterPublishFailsWhenReturned(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := testenv.ConfirmChannel(t)
	d := &deadLetter{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 64))}

	gone := testenv.Name("bf_dlq_gone")
	err := d.publish(ctx, gone, amqp.Publishing{MessageId: "m1", Body: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "returned") {
		t.Fatalf("publish to a missing queue: %v, want a return", err)
	}

	// A return left over from a publish whose wait gave up.
	if _, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", gone, true, false, amqp.Publishing{MessageId: "stale"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(d.returns) == 1 }, "no return for the stale publish")

	queue := testenv.Name("bf_dlq")
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.publish(ctx, queue, amqp.Publishing{MessageId: "m2", Body: []byte("x")}); err != nil {
		t.Fatalf("publish to an existing queue: %v", err)
	}
	got, ok, err := ch.Get(queue, true)
	if err != nil || !ok || got.MessageId != "m2" {
		t.Fatalf("dead-letter queue holds %q (%v, %v), want m2", got.MessageId, ok, err)
	}
}
