package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/relay"
)

// pending is one published message awaiting its confirm.
type pending struct {
	msgID     string
	returned  string // reply text of a basic.return, if one came
	abandoned bool   // its publisher stopped waiting (guarded by link.mu)
	done      chan struct{}
	err       error
}

// link is one connection and its confirm-mode channel, with the bookkeeping
// that pairs confirms and returns with publishes. A new link replaces it when
// it ends.
type link struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	cork *amqpio.Conn
	node string // host:port of the RabbitMQ node, for logs

	mu       sync.Mutex
	byTag    map[uint64]*pending
	byMsgID  map[string]*pending
	early    map[uint64]bool   // confirms that beat their registration
	earlyRet map[string]string // returns that beat their registration
	dead     bool
	err      error
	acked    time.Time           // the last ack, or since when publishes wait (watchStall)
	nacks    int                 // nacks since the last ack
	cut      error               // why watchStall closed the connection
	blocked  string              // why RabbitMQ blocked the connection; "" while it is not
	probing  bool                // blocked only until probe hears otherwise
	lateOK   func(msgID string)  // told of confirms that came after their publisher gave up
	hook     func()              // Config.beforeEvent
	onBlock  func(reason string) // told when RabbitMQ blocks ("" when it unblocks) the connection
	onReturn func(amqp.Return)   // told of every basic.return, before it is applied

	exchanges exchangeSet // the routes' exchanges, checked

	done chan struct{} // closed when the channel or connection is gone
}

// The buffers of the events amqp091-go hands over: its reader drops a
// notification not taken within 5 s (a frozen process), and a dropped return
// or confirm would be a wrong verdict. A send into a buffer with room never
// waits; confirmBuffer holds the relay's in-flight batches many times over.
const (
	confirmBuffer = 1 << 16
	returnBuffer  = 1 << 10
)

func newLink(conn *amqp.Connection, ch *amqp.Channel, lateOK func(string), hook func(), onBlock func(string), onReturn func(amqp.Return)) *link {
	l := &link{
		conn: conn, ch: ch, lateOK: lateOK, hook: hook, onBlock: onBlock, onReturn: onReturn,
		byTag: map[uint64]*pending{}, byMsgID: map[string]*pending{},
		early: map[uint64]bool{}, earlyRet: map[string]string{},
		done: make(chan struct{}), acked: time.Now(),
	}
	e := &linkEvents{
		l:          l,
		confirms:   ch.NotifyPublish(make(chan amqp.Confirmation, confirmBuffer)),
		returns:    ch.NotifyReturn(make(chan amqp.Return, returnBuffer)),
		chClosed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		connClosed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		blocked:    conn.NotifyBlocked(make(chan amqp.Blocking, 4)),
	}
	go e.run()
	return l
}

// publish sends one message and registers it for its confirm.
func (l *link) publish(ctx context.Context, exchange, key, msgID string, pub amqp.Publishing) (*pending, error) {
	dc, err := l.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, pub)
	if err != nil {
		return nil, err
	}
	if dc == nil {
		return nil, errors.New("channel not in confirm mode")
	}
	p := &pending{msgID: msgID, done: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.earlyRet[msgID]; ok {
		delete(l.earlyRet, msgID)
		p.returned = r
	}
	// A confirm that came before the registration (another batch's flush
	// sent the frames) is the verdict, even if the connection died since.
	if ack, ok := l.early[dc.DeliveryTag]; ok {
		delete(l.early, dc.DeliveryTag)
		p.confirm(ack)
		return p, nil
	}
	if l.dead {
		p.resolve(relay.Unavailable(l.err))
		return p, nil
	}
	l.waiting()
	l.byTag[dc.DeliveryTag] = p
	l.byMsgID[msgID] = p
	return p, nil
}

// inFlight returns the unanswered publish of msgID on this link, if any.
func (l *link) inFlight(msgID string) *pending {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byMsgID[msgID]
}

func (l *link) returned(r amqp.Return) {
	if l.hook != nil {
		l.hook()
	}
	if l.onReturn != nil {
		l.onReturn(r) // it logs: outside mu
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answered(true)
	reason := fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
	if p, ok := l.byMsgID[r.MessageId]; ok {
		p.returned = reason
		return
	}
	l.earlyRet[r.MessageId] = reason
}

func (l *link) onConfirm(c amqp.Confirmation) {
	if l.hook != nil {
		l.hook()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answered(c.Ack)
	p, ok := l.byTag[c.DeliveryTag]
	if !ok {
		l.early[c.DeliveryTag] = c.Ack
		return
	}
	delete(l.byTag, c.DeliveryTag)
	if l.byMsgID[p.msgID] == p {
		delete(l.byMsgID, p.msgID)
	}
	p.confirm(c.Ack)
	if p.abandoned && p.err == nil && l.lateOK != nil {
		l.lateOK(p.msgID)
	}
}

// abandon marks p as no longer waited for, unless it was resolved in the
// meantime: then it returns its verdict.
func (l *link) abandon(p *pending) (resolved bool, verdict error) {
	l.mu.Lock()
	defer l.mu.Unlock()
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
		p.resolve(fmt.Errorf("%w: %s", relay.ErrReturned, p.returned))
	case !ack:
		p.resolve(relay.ErrNacked)
	default:
		p.resolve(nil)
	}
}

func (p *pending) resolve(err error) {
	p.err = err
	close(p.done)
}

// failAll resolves every pending publish as unknown; used once, when the
// link ends.
func (l *link) failAll(err error) {
	if err == nil {
		err = errors.New("amqp session closed")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return
	}
	if l.cut != nil {
		err = l.cut
	}
	l.dead, l.err = true, err
	verdict := relay.Unavailable(err)
	if l.blocked != "" {
		// RabbitMQ had stopped reading: what it had not read may still be
		// queued when the alarm clears, so hold these back as long as a
		// confirm that may still come.
		verdict = relay.AwaitingConfirm(fmt.Errorf("%w (RabbitMQ had blocked the connection: %s)", err, l.blockedText()))
	}
	for _, p := range l.byTag {
		p.resolve(verdict)
	}
	l.byTag, l.byMsgID = nil, nil
}
