package backfill

import (
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// acker settles one channel's deliveries, which batches finish out of order,
// with one multiple-ack per run of settled tags. A consumerConn's consume
// loop and its batches call it concurrently; mu guards the fields below it.
type acker struct {
	ch amqp.Acknowledger

	mu sync.Mutex
	// nextTag is the lowest delivery tag not settled yet; advance moves it
	// past each settled tag in order.
	nextTag uint64
	settled map[uint64]settlement // tags settled out of order, above nextTag
	held    int                   // hold counts each delivery left unacked until the channel closes
	// heldPassed counts the held deliveries below nextTag: while any is, a
	// multiple-ack would ack it too, so acks go one by one.
	heldPassed int
	// kept holds the tags below nextTag that keep left unacked; ackAll or
	// requeue settles each on its own later.
	kept map[uint64]bool
}

// settlement is how a tag was settled: acked (done, called once the ack
// went out), requeued (already sent) or held.
type settlement struct {
	done func()
	kind settleKind
}

type settleKind uint8

const (
	settleAck settleKind = iota
	settleRequeue
	settleHold
	settleKeep
)

func newAcker(ch amqp.Acknowledger) *acker {
	return &acker{ch: ch, nextTag: 1, settled: map[uint64]settlement{}, kept: map[uint64]bool{}}
}

// holding says whether a delivery below nextTag is unacked, which a
// multiple-ack would ack too.
func (a *acker) holding() bool { return a.heldPassed > 0 || len(a.kept) > 0 }

// ack acks d once every earlier delivery is settled too, then calls done
// (if the ack reached the channel; if it did not, the channel is gone and
// RabbitMQ redelivers the message).
func (a *acker) ack(d amqp.Delivery, done func()) {
	a.ackAll([]settled{{d, done}})
}

// settled is a delivery to ack and what to call once the ack went out.
type settled struct {
	d    amqp.Delivery
	done func()
}

// ackAll acks a batch as ack does each of its deliveries, with one frame
// for the batch when the run of settled tags covers it.
func (a *acker) ackAll(ss []settled) {
	if len(ss) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range ss {
		done := s.done
		if done == nil {
			done = func() {}
		}
		if a.kept[s.d.DeliveryTag] {
			// Below nextTag: acked on its own, now.
			delete(a.kept, s.d.DeliveryTag)
			if err := a.ch.Ack(s.d.DeliveryTag, false); err == nil {
				done()
			}
			continue
		}
		a.settled[s.d.DeliveryTag] = settlement{done: done, kind: settleAck}
	}
	a.advance()
}

// requeue returns d to the queue now.
func (a *acker) requeue(d amqp.Delivery) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	err := a.ch.Nack(d.DeliveryTag, false, true)
	if a.kept[d.DeliveryTag] {
		delete(a.kept, d.DeliveryTag)
	} else {
		a.settled[d.DeliveryTag] = settlement{kind: settleRequeue}
	}
	a.advance()
	return err
}

// keep leaves d, a message tried again in place, unacked for now, to be
// acked or requeued later, without holding up the acks after it. Keeping a
// delivery already kept does nothing.
func (a *acker) keep(d amqp.Delivery) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.kept[d.DeliveryTag] {
		return
	}
	a.settled[d.DeliveryTag] = settlement{kind: settleKeep}
	a.advance()
}

// hold leaves d unacked for as long as the channel lasts (it goes back to
// the queue when the channel closes), without holding up the acks of the
// deliveries after it.
func (a *acker) hold(d amqp.Delivery) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held++
	if a.kept[d.DeliveryTag] {
		delete(a.kept, d.DeliveryTag)
		a.heldPassed++
		return
	}
	a.settled[d.DeliveryTag] = settlement{kind: settleHold}
	a.advance()
}

// heldCount is how many deliveries are held: each takes one of the
// channel's prefetch.
func (a *acker) heldCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// advance moves nextTag past the run of settled tags and acks the run: one
// multiple-ack, or one ack each while holding. Called with mu held.
func (a *acker) advance() {
	var last uint64 // the multiple-ack's tag
	var done []func()
	type one struct {
		tag  uint64
		done func()
	}
	var single []one // past a held delivery
	for {
		s, ok := a.settled[a.nextTag]
		if !ok {
			break
		}
		delete(a.settled, a.nextTag)
		switch {
		case s.kind == settleHold:
			a.heldPassed++
		case s.kind == settleKeep:
			a.kept[a.nextTag] = true
		case s.kind == settleAck && a.holding():
			single = append(single, one{a.nextTag, s.done})
		case s.kind == settleAck:
			last = a.nextTag
			done = append(done, s.done)
		}
		a.nextTag++
	}
	if last != 0 {
		if err := a.ch.Ack(last, true); err != nil {
			return // channel gone: redelivered on reconnect, skipped by the record or deduped by JetStream
		}
		for _, fn := range done {
			fn()
		}
	}
	for _, o := range single {
		if err := a.ch.Ack(o.tag, false); err != nil {
			return // as above
		}
		o.done()
	}
}
