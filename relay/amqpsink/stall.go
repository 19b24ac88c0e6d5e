package amqpsink

import (
	"fmt"
	"time"

	"github.com/relayd/relayd/relay"
)

// StallTimeoutDefault is Config.StallTimeout's default.
const StallTimeoutDefault = 30 * time.Second

// watchStall closes the link's connection when RabbitMQ has acked nothing
// for the given time while publishes waited or were nacked, on a connection
// it has not blocked. A channel of RabbitMQ 3.10 that first published to a quorum
// queue while the queue's leader was lost (before the election) nacks every
// publish to it from then on; only a new channel finds the new leader. The
// link ends as a lost connection does, and supervise connects again, to the
// next node.
func (l *link) watchStall(after time.Duration) {
	t := time.NewTicker(max(after/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		}
		if l.stalled(after) {
			l.cork.Close() //nolint:errcheck // amqp091-go's reader ends the link on the closed socket
			return
		}
	}
}

// stalled reports whether the link has stalled, and if so records why, for
// failAll.
func (l *link) stalled(after time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead || (len(l.byTag) == 0 && l.nacks == 0) || l.blocked != "" || time.Since(l.acked) < after {
		return false
	}
	l.cut = fmt.Errorf("amqp: no ack for %s (%d nacks, %d publishes waiting) on a connection RabbitMQ has not blocked: closed it, to publish again on a new one", after, l.nacks, len(l.byTag))
	return true
}

// quietErr is the error of a publish held back because RabbitMQ has acked
// nothing for after while publishes wait on the link, nil otherwise. Those
// may be stored or not; each new one would be unknown too when the link is
// lost, and sent again on the next.
func (l *link) quietErr(after time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead || len(l.byTag) == 0 || l.blocked != "" {
		return nil
	}
	if quiet := time.Since(l.acked); quiet >= after {
		return relay.Unavailable(fmt.Errorf("amqp: RabbitMQ has acked nothing for %s while %d publishes wait: nothing new goes on this connection until it answers, or is replaced",
			quiet.Round(time.Millisecond), len(l.byTag)))
	}
	return nil
}

// answered notes RabbitMQ's answer to a publish (called with mu held): an
// ack or a return (which precedes an ack) restarts the stall clock, a nack
// does not.
func (l *link) answered(ack bool) {
	if ack {
		l.acked, l.nacks = time.Now(), 0
		return
	}
	l.nacks++
}

// waiting notes a publish registered (called with mu held): the stall
// clock starts with the first one waiting, unless nacks run it already.
func (l *link) waiting() {
	if len(l.byTag) == 0 && l.nacks == 0 {
		l.acked = time.Now()
	}
}
