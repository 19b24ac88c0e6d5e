// Package amqpsink publishes outbox messages to a RabbitMQ exchange with
// publisher confirms, for the relay's "amqp" (legacy) target.
//
// A message counts as delivered only when RabbitMQ acked it and did not
// return it first: messages are published persistent and mandatory, and an
// unroutable one comes back as basic.return BEFORE its ack. amqp091-go hands
// returns and confirms over from its single reader goroutine in wire order,
// into buffers this package reads on one goroutine of its own, taking every
// return already buffered before each confirm: a return is always seen
// before the ack of the same message. Each return is also warned of in the
// log at once, rate-limited per topic (see unroutable.go): the row is only
// retried, and parked when its attempts run out. (The buffers are there
// because amqp091-go drops a notification its listener has not taken within
// 5 s, as after a process was frozen that long.) A closed channel or
// connection resolves every pending publish as "unknown" (retry), and the
// sink reconnects by itself with capped backoff. A publish still unanswered
// at its deadline on a live connection stays registered: its confirm, when
// it comes, is reported to OnLateConfirm (the relay records the delivery)
// and answers a retry of the same message on this sink. A connection
// RabbitMQ blocks (a resource alarm) is kept, not closed: the sink is not
// Ready and publishes nothing new until RabbitMQ unblocks it.
package amqpsink

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/relay"
)

// Config configures a Sink.
type Config struct {
	// URL is the RabbitMQ URL, amqp:// or amqps://. Required.
	URL string
	// Exchange is where messages are published, with the row's topic as the
	// routing key. Required.
	Exchange string
	// TLS, when set, is used for amqps:// connections. Default: system roots.
	TLS *tls.Config
	// Logger receives connection events. Default: discard.
	Logger *slog.Logger

	// wrapConn, in tests, wraps each TCP connection below the cork.
	wrapConn func(net.Conn) net.Conn
	// beforeEvent, in tests, runs on the event goroutine before each
	// return or confirm is applied (to hold that goroutine up).
	beforeEvent func()
}

// Sink is the relay's RabbitMQ target.
type Sink struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	cur     *session // nil while disconnected
	lastErr error

	// late holds message ids RabbitMQ confirmed after the publish that sent
	// them had given up waiting (a confirm slower than the publish
	// timeout). When the relay retries such a row, it is already delivered:
	// publishing it again would queue a second copy.
	lateMu sync.Mutex
	late   map[string]time.Time
	onLate func(msgID string) // see OnLateConfirm

	unroutable *unroutableWarner

	stop    chan struct{}
	stopped chan struct{}
}

var (
	_ relay.Sink          = (*Sink)(nil)
	_ relay.LateConfirmer = (*Sink)(nil)
)

// New connects to RabbitMQ and returns a sink that stays connected until
// Close: after a connection loss it reconnects with capped backoff. New
// fails if the first connection cannot be made before ctx is done.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if cfg.URL == "" {
		return nil, errors.New("amqpsink: URL is required")
	}
	if cfg.Exchange == "" {
		return nil, errors.New("amqpsink: Exchange is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Sink{cfg: cfg, log: cfg.Logger.With("target", "amqp"), stop: make(chan struct{}), stopped: make(chan struct{}),
		late: map[string]time.Time{}}
	s.unroutable = newUnroutableWarner(s.log)
	var first *session
	var err error
	for {
		first, err = s.connect()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("amqp: connect: %w", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	s.cur = first // ready as soon as New returns
	go s.supervise(first)
	return s, nil
}

// Target implements relay.Sink.
func (s *Sink) Target() relay.Target { return relay.TargetAMQP }

// Ready implements relay.Sink.
func (s *Sink) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		return s.cur.blockedErr()
	}
	if s.lastErr != nil {
		return relay.Unavailable(s.lastErr)
	}
	return relay.Unavailable(errors.New("amqp: not connected"))
}

// Close disconnects; pending publishes resolve as unavailable.
func (s *Sink) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.stopped
	return nil
}

func (s *Sink) dial() (*amqp.Connection, *amqpio.Conn, error) {
	var cc *amqpio.Conn
	conn, err := amqp.DialConfig(s.cfg.URL, amqp.Config{
		Heartbeat:       10 * time.Second,
		TLSClientConfig: s.cfg.TLS,
		Properties:      amqp.Table{"connection_name": "relayd"},
		Dial:            amqpio.Dial(10*time.Second, s.cfg.wrapConn, func(c *amqpio.Conn) { cc = c }),
	})
	return conn, cc, err
}

func (s *Sink) connect() (*session, error) {
	conn, cork, err := s.dial()
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return nil, err
	}
	sess := newSession(conn, ch, s.confirmedLate, s.cfg.beforeEvent, s.blockedBy, s.unroutable.returned)
	sess.cork = cork
	return sess, nil
}

// blockedBy logs RabbitMQ blocking (reason) and unblocking ("") the
// connection.
func (s *Sink) blockedBy(reason string) {
	if reason != "" {
		s.log.Warn("RabbitMQ blocked the connection (resource alarm): publishing paused until it clears", "reason", reason)
		return
	}
	s.log.Info("RabbitMQ unblocked the connection: publishing again")
}

// lateTTL bounds how long a late confirm is remembered: far longer than the
// relay's retry backoff reaches before the row is retried.
const lateTTL = 15 * time.Minute

// OnLateConfirm implements relay.LateConfirmer.
func (s *Sink) OnLateConfirm(f func(msgID string)) {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	s.onLate = f
}

func (s *Sink) confirmedLate(msgID string) {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	if s.onLate != nil {
		s.onLate(msgID)
	}
	now := time.Now()
	if len(s.late)%1024 == 1023 {
		for id, at := range s.late {
			if now.Sub(at) > lateTTL {
				delete(s.late, id)
			}
		}
	}
	s.late[msgID] = now
}

// takeLate reports, once, whether msgID was confirmed late.
func (s *Sink) takeLate(msgID string) bool {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	at, ok := s.late[msgID]
	delete(s.late, msgID)
	return ok && time.Since(at) <= lateTTL
}

// closeWait bounds the close handshake: a connection RabbitMQ has blocked
// (a resource alarm) is not read, and its close-ok would not come until the
// alarm clears — Close, and relayd's exit, would wait that long.
const closeWait = 5 * time.Second

// close ends the session's connection: the close handshake, and if that
// takes closeWait, the socket. (amqp091-go's CloseDeadline is not enough:
// each heartbeat RabbitMQ sends moves the socket's read deadline on.)
func (s *session) close() {
	done := make(chan struct{})
	go func() {
		s.conn.Close() //nolint:errcheck // closed either way
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
		s.cork.Close() //nolint:errcheck // the handshake ends with the socket
		<-done
	}
	// And the socket in any case: amqp091-go's Close returns at once on a
	// connection it is already shutting down, which it may be doing
	// without having closed the socket yet (its shutdown waits for a
	// writer stuck on a peer that does not read).
	s.cork.Close() //nolint:errcheck // closed either way
}

// supervise keeps a session up until Close.
func (s *Sink) supervise(sess *session) {
	defer close(s.stopped)
	backoff := time.Duration(0)
	alarm := "" // why RabbitMQ had blocked the last connection when it ended
	for {
		if sess != nil {
			if alarm != "" {
				sess.mu.Lock() // blocked before anyone sees it
				sess.blocked, sess.probing = alarm, true
				sess.mu.Unlock()
				go sess.probe()
			}
			s.mu.Lock()
			s.cur, s.lastErr = sess, nil
			s.mu.Unlock()
			if backoff > 0 {
				s.log.Info("amqp reconnected")
			}
			backoff = 0
			select {
			case <-s.stop:
				s.drop(sess, errors.New("sink closed"))
				sess.close()
				return
			case <-sess.done:
			}
			alarm = sess.alarmReason()
			s.drop(sess, sess.err)
			s.log.Warn("amqp connection lost", "error", errString(sess.err))
			sess.close()
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 10*time.Second)
		select {
		case <-s.stop:
			return
		case <-time.After(backoff):
		}
		var err error
		sess, err = s.connect()
		if err != nil {
			s.mu.Lock()
			s.lastErr = err
			s.mu.Unlock()
			s.log.Debug("amqp connect failed", "error", err.Error())
		}
	}
}

func (s *Sink) drop(sess *session, err error) {
	s.mu.Lock()
	if s.cur == sess {
		s.cur, s.lastErr = nil, err
	}
	s.mu.Unlock()
	sess.failAll(err)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Publish implements relay.Sink.
func (s *Sink) Publish(ctx context.Context, msgs []*relay.Message, results []error) {
	s.mu.Lock()
	sess := s.cur
	s.mu.Unlock()
	if sess == nil {
		err := s.Ready()
		for i := range results {
			results[i] = err
		}
		return
	}
	// Nothing new onto a connection RabbitMQ does not read (a resource
	// alarm): the write would wait in the socket for the alarm to clear,
	// and the batch's confirms with it.
	blocked := sess.blockedErr()
	// The batch's publishes leave in one write (see amqpio.Conn), sent
	// before the waiting starts.
	deadline, _ := ctx.Deadline()
	corked := blocked == nil
	if corked {
		sess.cork.Cork()
	}
	uncork := func() {
		if corked {
			corked = false
			sess.cork.Uncork(deadline) //nolint:errcheck // a failed flush closes the connection: the waits below end as unknown
		}
	}
	defer uncork()
	waits := make([]*pending, len(msgs))
	for i, m := range msgs {
		if len(m.Topic) > 255 {
			results[i] = relay.Permanent("amqp: routing key longer than 255 bytes")
			continue
		}
		if reason := badHeaders(m.Headers); reason != "" {
			results[i] = relay.Permanent("amqp: headers: %s", reason)
			continue
		}
		pub := Publishing(m)
		if err := pub.Headers.Validate(); err != nil {
			results[i] = relay.Permanent("amqp: headers: %v", err)
			continue
		}
		if n, most := contentHeaderSize(&pub), sess.conn.Config.FrameSize-frameOverhead; most > 0 && n > most {
			// amqp091-go splits only the body into frames: RabbitMQ closes
			// the connection on a content header over its frame_max, and
			// every publish in flight on it with it, batch after batch.
			results[i] = relay.Permanent("amqp: headers: the message's properties take %d bytes, more than a frame holds (%d: RabbitMQ's frame_max)", n, most)
			continue
		}
		if s.takeLate(m.MessageID) {
			results[i] = nil // confirmed after its publish gave up waiting
			continue
		}
		if p := sess.inFlight(m.MessageID); p != nil {
			// An earlier publish of this message is still unanswered on
			// this live connection (it outlived a publish timeout).
			// Publishing again would queue a second copy: wait for that
			// one's verdict instead.
			waits[i] = p
			continue
		}
		if blocked != nil {
			results[i] = blocked
			continue
		}
		p, err := sess.publish(ctx, s.cfg.Exchange, m.Topic, m.MessageID, pub)
		if err != nil {
			results[i] = relay.Unavailable(fmt.Errorf("amqp publish: %w", err))
			continue
		}
		waits[i] = p
	}
	uncork()
	for i, p := range waits {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
			results[i] = p.err
		case <-ctx.Done():
			if resolved, err := sess.abandon(p); resolved {
				results[i] = err
				continue
			}
			results[i] = relay.AwaitingConfirm(fmt.Errorf("amqp: no confirm: %w", ctx.Err()))
		}
	}
}

// Publishing is the AMQP message the sink publishes for m: persistent, the
// row's message id as message-id, its created_at as timestamp, its headers
// as headers (content-type and correlation-id also as those properties).
func Publishing(m *relay.Message) amqp.Publishing {
	// No content type unless the row's headers give one: a default adds
	// nothing a consumer can use, and it costs RabbitMQ. With a UUID
	// message-id and the timestamp, "application/octet-stream" took the
	// encoded properties past 64 bytes, and RabbitMQ (Erlang: a binary
	// over 64 bytes lives off the process heap, reference-counted) then
	// spent 20–25 % more CPU per message and confirmed 20–25 % fewer a
	// second (see TestPropertiesStaySmall).
	p := amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    m.MessageID,
		Timestamp:    m.CreatedAt,
		Body:         m.Payload,
	}
	if len(m.Headers) > 0 {
		p.Headers = make(amqp.Table, len(m.Headers))
		for k, v := range m.Headers {
			p.Headers[k] = v
			switch k {
			case "content-type", "Content-Type":
				p.ContentType = v
			case "correlation-id", "Correlation-Id":
				p.CorrelationId = v
			}
		}
	}
	return p
}

// frameOverhead is an AMQP frame's bytes around its payload: type, channel
// and size before it, the end octet after.
const frameOverhead = 8

// contentHeaderSize is the payload of p's content header frame as amqp091-go
// writes it: class, weight, body size and property flags, then each
// property set. It counts the properties Publishing sets.
func contentHeaderSize(p *amqp.Publishing) int {
	n := 2 + 2 + 8 + 2
	shortstr := func(s string) {
		if s != "" {
			n += 1 + len(s)
		}
	}
	shortstr(p.ContentType)
	shortstr(p.CorrelationId)
	shortstr(p.MessageId)
	if len(p.Headers) > 0 {
		n += 4 // the table's length
		for k, v := range p.Headers {
			n += 1 + len(k) + 1 // key (a short string), value type
			if s, ok := v.(string); ok {
				n += 4 + len(s) // a long string
			} else {
				n += 8 // no other type is set; the widest scalar
			}
		}
	}
	if p.DeliveryMode != 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// badHeaders says why RabbitMQ cannot take one of h's headers, or "".
func badHeaders(h map[string]string) string {
	return headers.First(h, headers.AMQPReason)
}

// ErrReturned is a message RabbitMQ could not route to any queue.
var ErrReturned = errors.New("amqp: returned unroutable")

// ErrNacked is a message RabbitMQ refused to take responsibility for: a
// queue it was routed to is full and set to refuse (x-overflow
// reject-publish), or a queue's process failed. It counts as one of the
// row's attempts, unlike JetStream's refusals for want of room
// (relay.ErrOutOfRoom): a nack says neither which it was nor which queue —
// a message routed to several queues is in the others already, and each
// publish again puts another copy there — so the retries back off and end,
// parked, after MaxAttempts (RELAY_MAX_ATTEMPTS=0: never).
var ErrNacked = errors.New("amqp: nacked by broker")

// pending is one published message awaiting its confirm.
type pending struct {
	msgID     string
	returned  string // reply text of a basic.return, if one came
	abandoned bool   // its publisher stopped waiting (guarded by session.mu)
	done      chan struct{}
	err       error
}

// session is one connection and its confirm-mode channel, with the
// bookkeeping that pairs confirms and returns with publishes.
type session struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	cork *amqpio.Conn

	mu       sync.Mutex
	byTag    map[uint64]*pending
	byMsgID  map[string]*pending
	early    map[uint64]bool   // confirms that beat their registration
	earlyRet map[string]string // returns that beat their registration
	dead     bool
	err      error
	blocked  string              // why RabbitMQ blocked the connection; "" while it is not
	probing  bool                // blocked only until probe hears otherwise
	lateOK   func(msgID string)  // told of confirms that came after their publisher gave up
	hook     func()              // Config.beforeEvent
	onBlock  func(reason string) // told when RabbitMQ blocks ("" when it unblocks) the connection
	onReturn func(amqp.Return)   // told of every basic.return, before it is applied

	done chan struct{} // closed when the channel or connection is gone
}

// The buffers of the events amqp091-go hands over. Its reader goroutine
// gives up on a notification the listener has not taken within 5 s and drops
// it: a dropped return would count an unroutable message as delivered, a
// dropped confirm would leave its publish unanswered until the session ends.
// A listener is that late only when the process was frozen, and then the
// 5 s have passed by the time the reader runs again. A send into a buffer
// with room does not wait at all, however late readEvents is.
// Confirms outstanding on a session are at most the relay's batches in
// flight times the batch size (4,000 by default): 65,536 of them (1 MiB) hold
// that many times over. Past that, a full buffer makes the reader wait, as
// an unbuffered channel always did.
const (
	confirmBuffer = 1 << 16
	returnBuffer  = 1 << 10
)

func newSession(conn *amqp.Connection, ch *amqp.Channel, lateOK func(string), hook func(), onBlock func(string), onReturn func(amqp.Return)) *session {
	s := &session{
		conn: conn, ch: ch, lateOK: lateOK, hook: hook, onBlock: onBlock, onReturn: onReturn,
		byTag: map[uint64]*pending{}, byMsgID: map[string]*pending{},
		early: map[uint64]bool{}, earlyRet: map[string]string{},
		done: make(chan struct{}),
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, confirmBuffer))
	returns := ch.NotifyReturn(make(chan amqp.Return, returnBuffer))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go s.readEvents(confirms, returns, chClosed, connClosed, blocked)
	return s
}

func (s *session) readEvents(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return,
	chClosed, connClosed <-chan *amqp.Error, blocked <-chan amqp.Blocking) {
	// Keep draining until amqp091 closes confirms: its reader goroutine holds
	// the channel's confirms lock while it hands confirms over, and the
	// channel's shutdown waits for that lock. Returning at the first close
	// signal would leave it blocked (5 s per remaining confirm).
	ended := false
	end := func(err error) {
		if !ended {
			ended = true
			s.failAll(err)
			close(s.done)
		}
	}
	defer end(errors.New("amqp channel closed"))
	// Wire order from two buffers: the reader put a message's return into
	// its buffer before it read the message's ack, so every return buffered
	// when a confirm is taken is applied first, and every event buffered
	// when the session ends is applied before it ends.
	returnsFirst := func() {
		for returns != nil {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					return
				}
				s.returned(r)
			default:
				return
			}
		}
	}
	confirm := func(c amqp.Confirmation) {
		returnsFirst()
		s.onConfirm(c)
	}
	setBlocked := func(b amqp.Blocking) {
		reason := ""
		if b.Active {
			reason = cmp.Or(b.Reason, "no reason given")
		}
		s.mu.Lock()
		s.blocked, s.probing = reason, false
		s.mu.Unlock()
		if s.onBlock != nil {
			s.onBlock(reason)
		}
	}
	buffered := func() {
		for {
			select {
			case c, ok := <-confirms:
				if ok {
					confirm(c)
					continue
				}
			default:
			}
			returnsFirst()
			// A connection.blocked that came before the close: the
			// session ends blocked (failAll: awaiting confirm).
			for blocked != nil {
				select {
				case b, ok := <-blocked:
					if !ok {
						blocked = nil
						continue
					}
					setBlocked(b)
					continue
				default:
				}
				break
			}
			return
		}
	}
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.returned(r)
		case c, ok := <-confirms:
			if !ok {
				return
			}
			confirm(c)
		case e := <-chClosed:
			chClosed = nil
			buffered()
			end(amqpErr("channel closed", e))
		case e := <-connClosed:
			connClosed = nil
			buffered()
			end(amqpErr("connection closed", e))
		case b, ok := <-blocked:
			if !ok { // amqp091-go closes it with the connection
				blocked = nil
				continue
			}
			// A resource alarm: RabbitMQ stopped reading from the
			// connection. What it read before goes on to the queues and
			// is confirmed; what it had not read waits in the socket
			// until the alarm clears, and is read then. So the session
			// stays: its pending publishes get their verdicts (late ones
			// through lateOK), and no message is sent again while its
			// first copy may still be read. New publishes are refused
			// until RabbitMQ unblocks the connection (see Publish).
			// Closing it instead, as this did, turned every publish in
			// flight into an unknown to retry: a second copy of each one
			// RabbitMQ had read, once per alarm.
			setBlocked(b)
		}
	}
}

func amqpErr(what string, e *amqp.Error) error {
	if e == nil {
		return errors.New("amqp " + what)
	}
	return fmt.Errorf("amqp %s: %w", what, e)
}

func (s *session) publish(ctx context.Context, exchange, key, msgID string, pub amqp.Publishing) (*pending, error) {
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, pub)
	if err != nil {
		return nil, err
	}
	if dc == nil {
		return nil, errors.New("channel not in confirm mode")
	}
	p := &pending{msgID: msgID, done: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.earlyRet[msgID]; ok {
		delete(s.earlyRet, msgID)
		p.returned = r
	}
	// Its confirm may have come before it was registered here (another
	// batch's flush sent its frames) — and the connection died since: the
	// confirm is the verdict, not the death.
	if ack, ok := s.early[dc.DeliveryTag]; ok {
		delete(s.early, dc.DeliveryTag)
		p.confirm(ack)
		return p, nil
	}
	if s.dead {
		p.resolve(relay.Unavailable(s.err))
		return p, nil
	}
	s.byTag[dc.DeliveryTag] = p
	s.byMsgID[msgID] = p
	return p, nil
}

// alarmReason is why RabbitMQ blocked the connection — or the one before
// it, while probing — "" if it has not.
func (s *session) alarmReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked
}

// blockedText says why the session is blocked, for errors. Called with mu
// held.
func (s *session) blockedText() string {
	if s.probing {
		return s.blocked + " (on the connection before this one; probing it)"
	}
	return s.blocked
}

// probeKey routes a probe nowhere: the default exchange delivers to the
// queue of that name, and no client may declare a queue named "amq.…".
// It goes unmandatory, on a channel of its own: a user not allowed to write
// to the default exchange has that channel closed (403), which answers the
// probe as well as an ack — RabbitMQ read it — and leaves the session's
// channel alone.
const probeKey = "amq.relayd.alarm-probe"

// probe finds out whether RabbitMQ still blocks publishers, on a new
// connection that replaced one it had blocked (supervise marks it blocked
// and probing first). RabbitMQ tells a connection it is blocked only once
// it publishes, so until then the session counts as blocked, and one
// empty message goes to probeKey: if an
// alarm is still on, RabbitMQ blocks the connection at it (and readEvents
// hears so); if not, it answers the probe. Without this, every
// reconnection during an alarm wrote whole batches into a connection that
// RabbitMQ then stopped reading.
func (s *session) probe() {
	ch, err := s.conn.Channel()
	if err != nil {
		return // the session is ending
	}
	defer ch.Close() //nolint:errcheck // closed or closing either way
	if err := ch.Confirm(false); err != nil {
		return
	}
	acked := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.PublishWithContext(context.Background(), "", probeKey, false, false, amqp.Publishing{}); err != nil {
		return
	}
	select {
	case <-acked:
	case <-closed: // refused (or the connection went: then s.done too)
	case <-s.done:
		return
	}
	// Answered. A connection.blocked sent before the answer may reach
	// readEvents after it (two buffers): give it a moment.
	select {
	case <-time.After(probeGrace):
	case <-s.done:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.probing { // no connection.blocked since: RabbitMQ reads
		s.blocked, s.probing = "", false
	}
}

// probeGrace is how long after a probe's answer a connection.blocked may
// still come.
const probeGrace = 250 * time.Millisecond

// blockedErr is the error of a publish refused because RabbitMQ blocked the
// connection, nil while it has not.
func (s *session) blockedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocked == "" {
		return nil
	}
	return relay.Unavailable(fmt.Errorf("amqp: connection blocked by RabbitMQ (resource alarm): %s", s.blockedText()))
}

// inFlight returns the unanswered publish of msgID on this session, if any.
func (s *session) inFlight(msgID string) *pending {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byMsgID[msgID]
}

func (s *session) returned(r amqp.Return) {
	if s.hook != nil {
		s.hook()
	}
	if s.onReturn != nil {
		s.onReturn(r) // it logs: outside mu
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	reason := fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
	if p, ok := s.byMsgID[r.MessageId]; ok {
		p.returned = reason
		return
	}
	s.earlyRet[r.MessageId] = reason
}

func (s *session) onConfirm(c amqp.Confirmation) {
	if s.hook != nil {
		s.hook()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.byTag[c.DeliveryTag]
	if !ok {
		s.early[c.DeliveryTag] = c.Ack
		return
	}
	delete(s.byTag, c.DeliveryTag)
	if s.byMsgID[p.msgID] == p {
		delete(s.byMsgID, p.msgID)
	}
	p.confirm(c.Ack)
	if p.abandoned && p.err == nil && s.lateOK != nil {
		s.lateOK(p.msgID)
	}
}

// abandon marks p as no longer waited for, unless it was resolved in the
// meantime: then it returns its verdict.
func (s *session) abandon(p *pending) (resolved bool, verdict error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-p.done:
		return true, p.err
	default:
		p.abandoned = true
		return false, nil
	}
}

func (p *pending) confirm(ack bool) {
	switch {
	case p.returned != "":
		p.resolve(fmt.Errorf("%w: %s", ErrReturned, p.returned))
	case !ack:
		p.resolve(ErrNacked)
	default:
		p.resolve(nil)
	}
}

func (p *pending) resolve(err error) {
	p.err = err
	close(p.done)
}

// failAll resolves every pending publish as unknown; used once, when the
// session ends.
func (s *session) failAll(err error) {
	if err == nil {
		err = errors.New("amqp session closed")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return
	}
	s.dead, s.err = true, err
	verdict := relay.Unavailable(err)
	if s.blocked != "" {
		// RabbitMQ had stopped reading: what it had not read may still be
		// in its socket buffer, read (and queued) when the alarm clears
		// although the connection is gone. Hold these back as long as
		// a confirm that may still come (the relay waits a publish
		// timeout at least before publishing them again).
		verdict = relay.AwaitingConfirm(fmt.Errorf("%w (RabbitMQ had blocked the connection: %s)", err, s.blockedText()))
	}
	for _, p := range s.byTag {
		p.resolve(verdict)
	}
	s.byTag, s.byMsgID = nil, nil
}

// EnsureExchange checks that the exchange exists, or with create declares
// it as a durable topic exchange. A missing exchange is reported by name.
// It never declares a queue: a durable catch-all that nobody reads would
// keep every message and fill RabbitMQ (relayd tail binds a temporary one).
func EnsureExchange(ctx context.Context, url string, tlsCfg *tls.Config, name string, create bool) error {
	conn, err := amqp.DialConfig(url, amqp.Config{TLSClientConfig: tlsCfg, Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return fmt.Errorf("amqp: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: channel: %w", err)
	}
	if create {
		if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: declare exchange %q: %w", name, err)
		}
		return nil
	}
	if err := ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("amqp: exchange %q does not exist (create it, or set RELAY_PROVISION=true)", name)
		}
		return fmt.Errorf("amqp: check exchange %q: %w", name, err)
	}
	return nil
}
