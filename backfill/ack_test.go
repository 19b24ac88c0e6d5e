package backfill

import (
	"fmt"
	"reflect"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

type recAck struct{ calls []string }

func (r *recAck) Ack(tag uint64, multiple bool) error {
	r.calls = append(r.calls, fmt.Sprintf("ack %d %v", tag, multiple))
	return nil
}

func (r *recAck) Nack(tag uint64, multiple, requeue bool) error {
	r.calls = append(r.calls, fmt.Sprintf("nack %d %v %v", tag, multiple, requeue))
	return nil
}

func (r *recAck) Reject(tag uint64, requeue bool) error {
	r.calls = append(r.calls, fmt.Sprintf("reject %d %v", tag, requeue))
	return nil
}

// tagged is a delivery with tag.
func tagged(tag uint64) amqp.Delivery { return amqp.Delivery{DeliveryTag: tag} }

// ackRig is an acker over a recording channel, and ack, which acks a tag
// and notes in acked that its done callback ran.
func ackRig() (r *recAck, a *acker, acked map[uint64]bool, ack func(tag uint64)) {
	r = &recAck{}
	a = newAcker(r)
	acked = map[uint64]bool{}
	return r, a, acked, func(tag uint64) { a.ack(tagged(tag), func() { acked[tag] = true }) }
}

// Acks go out as multiple-acks over runs of settled tags and never cover a
// delivery still in flight; requeues go out at once.
func TestAckerNeverCoversUnsettled(t *testing.T) {
	r, a, acked, ack := ackRig()

	ack(2)
	ack(3) // 1 in flight: nothing may go out
	if len(r.calls) != 0 || len(acked) != 0 {
		t.Fatalf("acked past an unsettled delivery: %v", r.calls)
	}
	a.requeue(tagged(5)) // out at once, on its own
	ack(1)               // 1..3 settled: one multiple-ack up to 3
	ack(6)               // 4 in flight
	a.requeue(tagged(4)) // 4..6 settled: 4 and 5 requeued already, ack 6
	want := []string{"nack 5 false true", "ack 3 true", "nack 4 false true", "ack 6 true"}
	if !reflect.DeepEqual(r.calls, want) {
		t.Fatalf("calls %v, want %v", r.calls, want)
	}
	if len(acked) != 4 || !acked[1] || !acked[2] || !acked[3] || !acked[6] {
		t.Fatalf("done callbacks for %v, want 1, 2, 3, 6", acked)
	}
}

// A delivery held unacked (JetStream refuses it for good, no dead-letter
// queue) does not hold up the acks of the deliveries after it: a
// multiple-ack would ack it too, so from there on they go one by one.
func TestAckerHoldDoesNotBlockLaterAcks(t *testing.T) {
	r, a, acked, ack := ackRig()

	ack(1)
	ack(2)            // acked as they come: no hold yet
	a.hold(tagged(3)) // 3 stays unacked
	ack(5)            // 4 in flight: nothing yet
	ack(4)            // 4 and 5, each on its own
	a.ackAll([]settled{{tagged(6), func() { acked[6] = true }}, {tagged(7), func() { acked[7] = true }}})
	a.requeue(tagged(8))
	ack(9)
	want := []string{"ack 1 true", "ack 2 true", "ack 4 false", "ack 5 false", "ack 6 false", "ack 7 false", "nack 8 false true", "ack 9 false"}
	if !reflect.DeepEqual(r.calls, want) {
		t.Fatalf("calls %v, want %v", r.calls, want)
	}
	for _, tag := range []uint64{1, 2, 4, 5, 6, 7, 9} {
		if !acked[tag] {
			t.Errorf("no done callback for %d", tag)
		}
	}
	if acked[3] || len(acked) != 7 {
		t.Errorf("done callbacks for %v, want 1, 2, 4–7, 9", acked)
	}
}

// A delivery kept to settle later (tried again in place) does not hold up
// the acks after it: they go one by one while it is kept, and as
// multiple-acks again once it is settled, acked or requeued on its own.
func TestAckerKeepDoesNotBlockLaterAcks(t *testing.T) {
	r, a, acked, ack := ackRig()

	ack(1)
	a.keep(tagged(2))
	a.keep(tagged(2)) // again: no change
	ack(3)            // past the kept one: on its own
	ack(2)            // the kept one, on its own
	ack(4)            // nothing kept: multiple-acks again
	a.keep(tagged(5))
	ack(6)
	a.requeue(tagged(5))
	ack(7)
	a.keep(tagged(8))
	a.hold(tagged(8)) // refused for good after all: held for the session
	ack(9)
	want := []string{"ack 1 true", "ack 3 false", "ack 2 false", "ack 4 true", "ack 6 false", "nack 5 false true", "ack 7 true", "ack 9 false"}
	if !reflect.DeepEqual(r.calls, want) {
		t.Fatalf("calls %v, want %v", r.calls, want)
	}
	if len(acked) != 7 || acked[5] || acked[8] {
		t.Fatalf("done callbacks for %v, want 1–4, 6, 7, 9", acked)
	}
	if a.heldCount() != 1 {
		t.Fatalf("held %d, want 1", a.heldCount())
	}
}
