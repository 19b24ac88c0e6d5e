package jspub

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Per-message states of a batch.
const (
	stateIdle    = iota // not published (nil, or failed before)
	statePending        // published, waiting for its PubAck; holds a window slot
	stateDone           // answered, or given up
)

// batch is one Publish call's PubAcks in flight.
type batch struct {
	p       *Publisher
	ctx     context.Context
	status  chan nats.Status
	replies chan *nats.Msg
	prefix  int // length of the reply subjects' inbox and dot
	errs    []error
	dup     []bool
	state   []uint8
	pending int

	// The ack timeout (nil timer: none): at holds when each message was
	// published, since start; the timer is set for the oldest still
	// pending (armed), see expire.
	start time.Time
	at    []time.Duration
	timer *time.Timer
	armed bool
}

// published counts message i as waiting for its PubAck.
func (b *batch) published(i int) {
	b.state[i] = statePending
	b.pending++
	if b.timer != nil {
		b.at[i] = time.Since(b.start)
		if !b.armed {
			b.timer.Reset(b.p.timeout)
			b.armed = true
		}
	}
}

// acquire takes a slot of the window, reading PubAcks while it waits.
func (b *batch) acquire() error {
	select {
	case b.p.window <- struct{}{}:
		return nil
	default:
	}
	for {
		got, err := b.wait(true)
		if err != nil {
			b.failPending(err)
			return err
		}
		if got {
			return nil
		}
	}
}

// wait reads one PubAck, or fails the publishes that waited the ack
// timeout, or with acquire takes a slot of the window (true), or says why
// the batch cannot wait any longer. PubAcks that came in meanwhile are read
// first: a message that was answered counts as answered.
func (b *batch) wait(acquire bool) (bool, error) {
	var window chan struct{} // nil: never ready
	if acquire {
		window = b.p.window
	}
	var timeout <-chan time.Time
	if b.timer != nil {
		timeout = b.timer.C
	}
	select {
	case window <- struct{}{}:
		return true, nil
	case m := <-b.replies:
		b.answer(m)
		return false, nil
	case st, ok := <-b.status:
		b.drain()
		if !ok || st == nats.CLOSED {
			return false, nats.ErrConnectionClosed
		}
		return false, nats.ErrDisconnected
	case <-timeout:
		b.drain()
		b.expire()
		return false, nil
	case <-b.ctx.Done():
		b.drain()
		return false, fmt.Errorf("no PubAck: %w", b.ctx.Err())
	}
}

// drain reads the PubAcks already in.
func (b *batch) drain() {
	for {
		select {
		case m := <-b.replies:
			b.answer(m)
		default:
			return
		}
	}
}

// expire fails the publishes that have waited for their PubAck for the ack
// timeout, and sets the timer for the oldest one left.
func (b *batch) expire() {
	b.armed = false
	now := time.Since(b.start)
	next := time.Duration(-1)
	for i, st := range b.state {
		if st != statePending {
			continue
		}
		if due := b.at[i] + b.p.timeout; due <= now {
			b.fail(i, jetstream.ErrAsyncPublishTimeout)
		} else if next < 0 || due < next {
			next = due
		}
	}
	if next >= 0 {
		b.timer.Reset(next - now)
		b.armed = true
	}
}

// answer records the PubAck m of one message of the batch.
func (b *batch) answer(m *nats.Msg) {
	i, err := strconv.Atoi(m.Subject[min(b.prefix, len(m.Subject)):])
	if err != nil || i < 0 || i >= len(b.state) || b.state[i] != statePending {
		return // not one this batch waits for
	}
	b.state[i] = stateDone
	b.pending--
	<-b.p.window
	b.dup[i], b.errs[i] = b.p.parseAck(m)
}

// fail gives up on pending message i.
func (b *batch) fail(i int, err error) {
	b.state[i] = stateDone
	b.pending--
	<-b.p.window
	b.errs[i] = err
}

// failPending gives up on every publish still waiting for its PubAck.
func (b *batch) failPending(err error) {
	for i, st := range b.state {
		if st == statePending {
			b.fail(i, err)
		}
	}
}

// release frees the window slots of publishes still pending, should the
// batch end by a panic (in answer's parsing, say).
func (b *batch) release() {
	for _, st := range b.state {
		if st == statePending {
			<-b.p.window
		}
	}
}
