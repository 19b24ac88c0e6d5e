package amqpsink

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// A confirm that came in before its publish was registered (another batch's
// flush sent the frames) is the publish's verdict even when the connection
// died in between: reported unknown, the row would be published again,
// and RabbitMQ's consumers would get it twice.
func TestEarlyConfirmWinsOverADeadSession(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	t.Parallel()
	ch := testenv.ConfirmChannel(t)
	// No event goroutine: the test places the events. Delivery tag 1 (the
	// channel's first publish) was acked, then the link died.
	s := &link{ch: ch,
		byTag: map[uint64]*pending{}, byMsgID: map[string]*pending{},
		early: map[uint64]bool{1: true}, earlyRet: map[string]string{}, done: make(chan struct{})}
	s.failAll(errors.New("test: connection lost"))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := s.publish(ctx, "", testenv.Name("early"), "m-1", amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		t.Fatal("publish not resolved")
	}
	if p.err != nil {
		t.Fatalf("publish whose confirm came before the session died: %v, want delivered", p.err)
	}
}

// Time a connection spent blocked by a resource alarm is not a stall: once
// the alarm clears, the publishes queued meanwhile get the full stall time
// for their first ack, so that they are not failed (and sent again) while
// RabbitMQ is still taking them in.
func TestBlockedTimeIsNotAStall(t *testing.T) {
	const after = time.Second
	l := &link{byTag: map[uint64]*pending{1: {}}, done: make(chan struct{})}
	l.acked = time.Now().Add(-time.Hour) // the last ack came long before the alarm
	l.setBlocked(amqp.Blocking{Active: true, Reason: "low on disk"})
	if l.stalled(after) {
		t.Fatal("a blocked connection counted as stalled")
	}
	l.setBlocked(amqp.Blocking{Active: false})
	if l.stalled(after) {
		t.Fatal("stalled at once after the alarm cleared: the time blocked counted")
	}
}
