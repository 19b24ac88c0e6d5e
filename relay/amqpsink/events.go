package amqpsink

import (
	"cmp"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// linkEvents reads what amqp091-go hands over for one link, on one
// goroutine. amqp091-go's reader puts a message's return into its buffer
// before it reads the message's ack, so every return buffered when a
// confirm is taken is applied first: a return is always seen before the
// ack of the same message.
type linkEvents struct {
	l          *link
	confirms   <-chan amqp.Confirmation
	returns    <-chan amqp.Return
	chClosed   <-chan *amqp.Error
	connClosed <-chan *amqp.Error
	blocked    <-chan amqp.Blocking
	ended      bool
}

// run applies events until amqp091-go closes confirms. Returning at the
// first close signal instead would block amqp091-go's shutdown, which waits
// for the confirms lock its reader holds while handing a confirm over.
func (e *linkEvents) run() {
	defer e.end(errors.New("amqp channel closed"))
	for e.next() {
	}
}

// next applies one event; false once confirms is closed.
func (e *linkEvents) next() bool {
	select {
	case r, ok := <-e.returns:
		if !ok {
			e.returns = nil
			return true
		}
		e.l.returned(r)
	case c, ok := <-e.confirms:
		if !ok {
			return false
		}
		e.confirm(c)
	case err := <-e.chClosed:
		e.chClosed = nil
		e.drain()
		e.end(amqpErr("channel closed", err))
	case err := <-e.connClosed:
		e.connClosed = nil
		e.drain()
		e.end(amqpErr("connection closed", err))
	case b, ok := <-e.blocked:
		if !ok { // amqp091-go closes it with the connection
			e.blocked = nil
			return true
		}
		// RabbitMQ stopped reading: what it has not read is read when the
		// alarm clears, so the link stays and no message is sent twice.
		e.l.setBlocked(b)
	}
	return true
}

// end fails what is still pending and marks the link done, once.
func (e *linkEvents) end(err error) {
	if !e.ended {
		e.ended = true
		e.l.failAll(err)
		close(e.l.done)
	}
}

func (e *linkEvents) confirm(c amqp.Confirmation) {
	e.returnsFirst()
	e.l.onConfirm(c)
}

// returnsFirst applies every return already buffered.
func (e *linkEvents) returnsFirst() {
	for e.returns != nil {
		select {
		case r, ok := <-e.returns:
			if !ok {
				e.returns = nil
				return
			}
			e.l.returned(r)
		default:
			return
		}
	}
}

// drain applies every event buffered when the link ends, before it ends. A
// connection.blocked among them leaves the link ending blocked (failAll:
// awaiting confirm).
func (e *linkEvents) drain() {
	for e.bufferedConfirm() {
	}
	e.returnsFirst()
	for e.bufferedBlock() {
	}
}

func (e *linkEvents) bufferedConfirm() bool {
	select {
	case c, ok := <-e.confirms:
		if ok {
			e.confirm(c)
			return true
		}
	default:
	}
	return false
}

func (e *linkEvents) bufferedBlock() bool {
	if e.blocked == nil {
		return false
	}
	select {
	case b, ok := <-e.blocked:
		if !ok {
			e.blocked = nil
			return false
		}
		e.l.setBlocked(b)
		return true
	default:
		return false
	}
}

// setBlocked applies connection.blocked (Active) or connection.unblocked.
func (l *link) setBlocked(b amqp.Blocking) {
	reason := ""
	if b.Active {
		reason = cmp.Or(b.Reason, "no reason given")
	}
	l.mu.Lock()
	if l.blocked != reason {
		l.acked = time.Now() // time blocked is not a stall (watchStall)
	}
	l.blocked, l.probing = reason, false
	l.mu.Unlock()
	if l.onBlock != nil {
		l.onBlock(reason)
	}
}
