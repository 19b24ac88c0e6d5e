// Package jspub publishes batches of messages to a JetStream stream and
// reads the PubAck of each, for the relay's JetStream target and the
// backfill.
//
// Each batch has a reply subscription of its own (an inbox, wildcard), and
// message i of the batch asks for its PubAck on inbox.i: the connection's
// reader hands each PubAck straight to the publishing goroutine. That is
// jetstream.PublishMsgAsync less its per-message costs (a future, a shared
// map under a lock, a second goroutine, encoding/json; see docs/design.md, "The JetStream publisher").
//
// What a failure means is as with PublishMsgAsync: a disconnect fails every
// publish still waiting for its PubAck with nats.ErrDisconnected (the
// message may be stored or not: publish it again with the same
// Nats-Msg-Id), and so does the ack timeout, with
// jetstream.ErrAsyncPublishTimeout.
package jspub

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// Publisher publishes to one stream through one connection. It is safe for
// concurrent use; publishes of all its batches share one window.
type Publisher struct {
	nc      *nats.Conn
	timeout time.Duration
	// window holds a slot per publish waiting for its PubAck.
	window chan struct{}
	// ackStored is how every PubAck of a message stored in the stream
	// begins: the server quotes the name with Go's %q (see parseAck).
	ackStored []byte
}

// New returns a publisher to stream through nc, with at most maxPending
// publishes waiting for their PubAcks, each for at most ackTimeout after it
// went out (0 or less: until the ctx of its Publish is done). A batch larger
// than the window that gets no PubAcks and has no deadline lasts about
// len/maxPending ack timeouts, as with PublishMsgAsync.
func New(nc *nats.Conn, stream string, maxPending int, ackTimeout time.Duration) *Publisher {
	return &Publisher{nc: nc, timeout: ackTimeout, window: make(chan struct{}, max(1, maxPending)),
		ackStored: []byte(`{"stream":` + strconv.Quote(stream) + `,`)}
}

// Publish publishes each non-nil msgs[i] and waits for its PubAck, until
// ctx is done: errs[i] is nil when the stream stored the message, and then
// dup[i] says whether it had it already (a repeat of its Nats-Msg-Id inside
// the duplicate window); otherwise errs[i] says why not. errs[i] and dup[i]
// of a nil message are left alone.
//
// Publish sets each message's Reply. It does not check which stream stored
// a message: callers set the Nats-Expected-Stream header, so that JetStream
// refuses a message for another stream (error 10060). A publish waits for
// room in the window, reading PubAcks meanwhile. A "no responders" answer
// (no stream for the subject, or JetStream restarting or electing a leader)
// comes back at once as nats.ErrNoResponders, not retried as
// PublishMsgAsync retries it: both callers publish the message again later.
func (p *Publisher) Publish(ctx context.Context, msgs []*nats.Msg, errs []error, dup []bool) {
	n := 0
	for _, m := range msgs {
		if m != nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	status := p.nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	defer p.nc.RemoveStatusListener(status)
	inbox := p.nc.NewInbox()
	// Room for a PubAck per message: the reader never finds it full.
	replies := make(chan *nats.Msg, n)
	sub, err := p.nc.ChanSubscribe(inbox+".*", replies)
	if err != nil {
		for i, m := range msgs {
			if m != nil {
				errs[i] = err
			}
		}
		return
	}
	defer sub.Unsubscribe() //nolint:errcheck // a closed connection has no subscription to end
	b := &batch{p: p, ctx: ctx, status: status, replies: replies, prefix: len(inbox) + 1,
		errs: errs, dup: dup, state: make([]uint8, len(msgs))}
	if p.timeout > 0 {
		b.start, b.at = time.Now(), make([]time.Duration, len(msgs))
		b.timer = time.NewTimer(p.timeout)
		b.timer.Stop()
		defer b.timer.Stop()
	}
	defer b.release()

	for i, m := range msgs {
		if m == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs[i] = fmt.Errorf("not published: %w", err)
			continue
		}
		if err := b.acquire(); err != nil {
			errs[i] = err
			continue
		}
		m.Reply = inbox + "." + strconv.Itoa(i)
		if err := p.nc.PublishMsg(m); err != nil {
			<-p.window
			errs[i] = err
			continue
		}
		b.published(i)
	}
	for b.pending > 0 {
		if _, err := b.wait(false); err != nil {
			b.failPending(err)
		}
	}
}
