// Package jspub publishes batches of messages to a JetStream stream and
// reads the PubAck of each, for the relay's JetStream target and the
// backfill.
//
// Each batch has a reply subscription of its own (an inbox, wildcard), and
// message i of the batch asks for its PubAck on inbox.i: the connection's
// reader hands each PubAck straight to the publishing goroutine. That is
// jetstream.PublishMsgAsync less its per-message costs (a future, a shared
// map under a lock, a second goroutine, encoding/json; see docs/design.md).
//
// What a failure means is as with PublishMsgAsync: a disconnect fails every
// publish still waiting for its PubAck with nats.ErrDisconnected (the
// message may be stored or not: publish it again with the same
// Nats-Msg-Id), and so does the ack timeout, with
// jetstream.ErrAsyncPublishTimeout.
package jspub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// parseAck reads a PubAck: whether the stream had the message already
// (Duplicate), or why it did not store it. The PubAck of a stored message is
// read as it is when it has a form the server writes from its template
// (storedAck); anything else (an error, a domain, a field a later server
// adds) by encoding/json, which was a seventh of relayd's CPU when it read
// every PubAck.
func (p *Publisher) parseAck(m *nats.Msg) (dup bool, err error) {
	d := m.Data
	if len(d) == 0 && m.Header.Get("Status") == "503" {
		return false, nats.ErrNoResponders
	}
	if dup, ok := p.storedAck(d); ok {
		return dup, nil
	}
	var pa struct {
		Error     *jetstream.APIError `json:"error"`
		Stream    string              `json:"stream"`
		Duplicate bool                `json:"duplicate"`
	}
	if err := json.Unmarshal(d, &pa); err != nil {
		return false, fmt.Errorf("%w: %v", jetstream.ErrInvalidJSAck, err)
	}
	if pa.Error != nil {
		return false, pa.Error
	}
	if pa.Stream == "" {
		return false, jetstream.ErrInvalidJSAck
	}
	return pa.Duplicate, nil
}

// storedAck reads d if it is the PubAck of a stored message in a form the
// server writes from its template: {"stream":NAME,"seq":N}, with
// ,"duplicate":true before the brace for a repeat (2.9 puts a space after
// the first comma and after the last colon; 2.10 and later not after the
// comma). It says whether the message is a repeat, and whether d is such a
// PubAck at all.
func (p *Publisher) storedAck(d []byte) (dup, ok bool) {
	rest, ok := bytes.CutPrefix(d, p.ackStored)
	if !ok {
		return false, false
	}
	if rest, ok = bytes.CutPrefix(bytes.TrimPrefix(rest, []byte(" ")), []byte(`"seq":`)); !ok {
		return false, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 {
		return false, false
	}
	switch string(rest[n:]) {
	case "}":
		return false, true
	case `,"duplicate": true}`, `,"duplicate":true}`:
		return true, true
	}
	return false, false
}

// Lookup answers, for one batch, whether no stream captures a subject: the
// question a "no responders" PubAck raises, since JetStream answers so both
// for a subject no stream captures (refuse the message for good) and while
// it restarts or elects a leader (publish it again later). It asks once per
// subject, and not again in the batch once JetStream did not answer: a
// restart answers a whole batch with "no responders".
type Lookup struct {
	js   jetstream.JetStream
	none map[string]bool
	down bool // a lookup failed other than "not found"
	// maxBytes: the stream's MaxBytes, looked up by TooLarge (-1: not yet;
	// 0: the lookup failed, or no limit).
	maxBytes int64
}

// NewLookup returns a lookup for one batch.
func NewLookup(js jetstream.JetStream) *Lookup {
	return &Lookup{js: js, none: map[string]bool{}, maxBytes: -1}
}

// NoStream reports whether JetStream said that no stream captures subject.
// false means a stream does, or JetStream could not say.
func (l *Lookup) NoStream(ctx context.Context, subject string) bool {
	if none, ok := l.none[subject]; ok || l.down {
		return none
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := l.js.StreamNameBySubject(lctx, subject)
	none := errors.Is(err, jetstream.ErrStreamNotFound)
	l.down = err != nil && !none
	l.none[subject] = none
	return none
}

// JetStream's refusals of a publish for want of room: the broker's state,
// not the message's. A stream with DiscardNew at its MaxMsgs, MaxBytes or
// MaxMsgsPerSubject refuses new messages until its consumers or MaxAge make
// room: the store's refusal, 10077, with the store's reason as the
// description (10077 with any other reason — a message too large for the
// store, a failing disk — is not room); an account or a server past its
// storage limits refuses with 10002 or 10023.
const (
	errCodeAccountResources = 10002 // resource limits exceeded for account
	errCodeInsufficient     = 10023 // insufficient resources
	errCodeStoreFailed      = 10077 // the store's reason as the description

	descMaxMsgs           = "maximum messages exceeded"
	descMaxBytes          = "maximum bytes exceeded" // also for a message over the whole of MaxBytes: see TooLarge
	descMaxMsgsPerSubject = "maximum messages per subject exceeded"
)

// OutOfRoom reports whether JetStream refused a publish for want of room.
func OutOfRoom(e *jetstream.APIError) bool {
	switch e.ErrorCode {
	case errCodeAccountResources, errCodeInsufficient:
		return true
	case errCodeStoreFailed:
		return e.Description == descMaxMsgs || e.Description == descMaxBytes || e.Description == descMaxMsgsPerSubject
	}
	return false
}

// TooLarge reports whether err is stream's "maximum bytes exceeded" for a
// message m larger than the stream's whole MaxBytes (it can never be
// stored), and that MaxBytes. The stream is looked up once per batch, on the
// first such refusal; when that fails, TooLarge says false (publish again
// later).
func (l *Lookup) TooLarge(ctx context.Context, stream string, m *nats.Msg, err error) (maxBytes int64, tooLarge bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStoreFailed || apiErr.Description != descMaxBytes {
		return 0, false
	}
	if l.maxBytes < 0 {
		l.maxBytes = 0
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if st, err := l.js.Stream(lctx, stream); err == nil {
			l.maxBytes = st.CachedInfo().Config.MaxBytes
		}
	}
	return l.maxBytes, l.maxBytes > 0 && StoredSize(m) > l.maxBytes
}

// StoredSize is about what a stream's store counts for m: its subject,
// headers and data, and a record's overhead (the file store's 30 bytes, as
// nats-server 2.10 and later check it; a message within a few dozen bytes
// of MaxBytes may be judged either way on other versions).
func StoredSize(m *nats.Msg) int64 {
	return int64(len(m.Subject)) + 30 + PayloadSize(m)
}

// PayloadSize is what nats.go holds against the server's max_payload: the
// data and the headers as they go on the wire ("NATS/1.0", a "key: value"
// line per value, trimmed of spaces as nats.go writes it, a blank line).
func PayloadSize(m *nats.Msg) int64 {
	n := int64(len(m.Data))
	if len(m.Header) > 0 {
		n += int64(len("NATS/1.0\r\n\r\n"))
	}
	for k, vs := range m.Header {
		for _, v := range vs {
			n += int64(len(k) + len(textproto.TrimString(v)) + 4)
		}
	}
	return n
}
