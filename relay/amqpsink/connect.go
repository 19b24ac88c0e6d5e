package amqpsink

import (
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/backoff"
)

// reconnect is supervise's wait between connection attempts.
var reconnect = backoff.Doubling{Floor: 100 * time.Millisecond, Cap: 10 * time.Second}

// dial connects to the next node of the list (see amqpio.Nodes): after a
// loss, another node than the one lost, if it answers.
func (s *Sink) dial() (*amqp.Connection, *amqpio.Conn, string, error) {
	var cc *amqpio.Conn
	conn, node, err := s.nodes.Dial(amqpio.DialOptions{
		TLS:     s.cfg.TLS,
		Name:    "relayd",
		Timeout: 10 * time.Second,
		Wrap:    s.cfg.wrapConn,
		Made:    func(c *amqpio.Conn) { cc = c },
	})
	return conn, cc, node, err
}

// connect opens a connection and its confirm-mode channel.
func (s *Sink) connect() (*link, error) {
	conn, cork, node, err := s.dial()
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
	l := newLink(conn, ch, s.confirmedLate, s.cfg.beforeEvent, s.blockedBy, s.unroutable.returned)
	l.cork, l.node = cork, node
	go l.watchStall(s.cfg.StallTimeout)
	return l, nil
}

// supervise keeps a link up until Close.
func (s *Sink) supervise(l *link) {
	defer close(s.stopped)
	wait := time.Duration(0)
	alarm := "" // why RabbitMQ had blocked the last connection when it ended
	for {
		if l != nil {
			if alarm != "" {
				l.startProbing(alarm)
			}
			s.mu.Lock()
			s.cur, s.lastErr = l, nil
			s.mu.Unlock()
			if wait > 0 {
				s.log.Info("amqp reconnected", "node", l.node)
			}
			wait = 0
			select {
			case <-s.stop:
				s.drop(l, errors.New("sink closed"))
				l.close()
				return
			case <-l.done:
			}
			alarm = l.alarmReason()
			s.drop(l, l.err)
			s.log.Warn("amqp connection lost", "node", l.node, "error", errString(l.err))
			l.close()
		}
		wait = reconnect.Next(wait)
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		var err error
		l, err = s.connect()
		if err != nil {
			s.mu.Lock()
			s.lastErr = err
			s.mu.Unlock()
			s.log.Debug("amqp connect failed", "error", err.Error())
		}
	}
}

func (s *Sink) drop(l *link, err error) {
	s.mu.Lock()
	if s.cur == l {
		s.cur, s.lastErr = nil, err
	}
	s.mu.Unlock()
	l.failAll(err)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// closeWait bounds the close handshake: RabbitMQ does not read a connection
// it has blocked, so its close-ok (and relayd's exit) would wait for the
// alarm to clear.
const closeWait = 5 * time.Second

// close ends the link's connection: the close handshake, and if that takes
// closeWait, the socket. amqp091-go's CloseDeadline is not enough: each
// heartbeat RabbitMQ sends moves the socket's read deadline on.
func (l *link) close() {
	done := make(chan struct{})
	go func() {
		l.conn.Close() //nolint:errcheck // closed either way
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
		l.cork.Close() //nolint:errcheck // the handshake ends with the socket
		<-done
	}
	// And the socket in any case: Close returns at once on a connection
	// amqp091-go is already shutting down, maybe with the socket still open.
	l.cork.Close() //nolint:errcheck // closed either way
}
