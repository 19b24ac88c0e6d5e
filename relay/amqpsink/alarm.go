package amqpsink

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/relay"
)

// alarmReason is why RabbitMQ blocked the connection — or the one before
// it, while probing — "" if it has not.
func (l *link) alarmReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.blocked
}

// blockedText says why the link is blocked, for errors. Called with mu held.
func (l *link) blockedText() string {
	if l.probing {
		return l.blocked + " (on the connection before this one; probing it)"
	}
	return l.blocked
}

// blockedErr is the error of a publish refused because RabbitMQ blocked the
// connection, nil while it has not.
func (l *link) blockedErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.blocked == "" {
		return nil
	}
	return relay.Unavailable(fmt.Errorf("amqp: connection blocked by RabbitMQ (resource alarm): %s", l.blockedText()))
}

// startProbing marks a link that replaced one RabbitMQ had blocked as
// blocked too, before anyone sees it, until probe finds out otherwise.
func (l *link) startProbing(alarm string) {
	l.mu.Lock()
	l.blocked, l.probing = alarm, true
	l.mu.Unlock()
	go l.probe()
}

// probeKey routes a probe nowhere: the default exchange delivers to the
// queue of that name, and no client may declare a queue named "amq.…". A
// user not allowed to write there has the probe's own channel closed (403),
// which answers the probe as well as an ack does.
const probeKey = "amq.relayd.alarm-probe"

// probeGrace is how long after a probe's answer a connection.blocked may
// still come.
const probeGrace = 250 * time.Millisecond

// probe finds out whether RabbitMQ still blocks publishers. RabbitMQ tells a
// connection it is blocked only once it publishes, so one empty message goes
// to probeKey: if an alarm is on, RabbitMQ blocks the connection at it;
// if not, it answers.
func (l *link) probe() {
	ch, err := l.conn.Channel()
	if err != nil {
		return // the link is ending
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
	case <-closed: // refused (or the connection went: then l.done too)
	case <-l.done:
		return
	}
	// A connection.blocked sent before the answer may reach the event
	// goroutine after it (two buffers): give it a moment.
	select {
	case <-time.After(probeGrace):
	case <-l.done:
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.probing { // no connection.blocked since: RabbitMQ reads
		l.blocked, l.probing = "", false
		l.acked = time.Now() // time blocked is not a stall (watchStall)
	}
}
