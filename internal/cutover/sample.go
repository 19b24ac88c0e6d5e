package cutover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/relay"
)

// sampleTable reads the outbox's conditions, fresh: its backlog for
// JetStream, the rows that left it without JetStream, the relays' phases.
func (w *watch) sampleTable(ctx context.Context) error {
	stats, err := relay.ReadStats(ctx, w.cfg.DB, w.cfg.Table, []relay.Target{relay.TargetNATS, relay.TargetAMQP})
	if err != nil {
		return fmt.Errorf("cutover: outbox: %w", err)
	}
	n, a := stats[0], stats[1]
	w.amqpLag, w.amqpParked = a.Lag, a.Parked
	// Rows that left the outbox without JetStream lately: once consumers
	// read only JetStream, such an instance's rows reach nobody.
	amqpOnly, _, _, err := relay.FinishedWithoutNATS(ctx, w.cfg.DB, w.cfg.Table, relay.DualWriteLookback, time.Time{})
	if err != nil {
		return fmt.Errorf("cutover: delivered rows: %w", err)
	}
	c := Condition{
		Name:   CondOutbox,
		OK:     n.Parked == 0 && amqpOnly == 0 && n.Lag < LagLimit,
		Detail: fmt.Sprintf("pending for nats %d, parked %d, lag %s", n.Pending, n.Parked, n.Lag.Round(time.Millisecond)),
	}
	if n.Lag >= LagLimit {
		c.Detail += fmt.Sprintf("; the relays are %s or more behind: a row owed to JetStream since %s", LagLimit, n.OldestAt.UTC().Format(time.RFC3339))
	}
	if amqpOnly > 0 {
		c.Detail += fmt.Sprintf("; %d rows finished in the last %s without JetStream: an instance runs without nats in RELAY_TARGETS", amqpOnly, relay.DualWriteLookback)
	}
	w.lag = n.Lag
	cp, tableNATS, err := relaydPhases(ctx, w.cfg)
	if err != nil {
		return fmt.Errorf("cutover: %w", err)
	}
	w.amqpOff = tableNATS
	// Keep the first failure seen: the watch reports what stopped it.
	if len(w.table) == 0 || allOK(w.table) {
		w.table = []Condition{c, cp}
	}
	return nil
}

func allOK(cs []Condition) bool {
	for _, c := range cs {
		if !c.OK {
			return false
		}
	}
	return true
}

// sampleQueue reads a group's legacy queue. A rolling-upgrade group's must
// be empty and unconsumed. A dual-read group's consumers read JetStream too,
// and may stay; its queue must be seen empty once, so that nothing waits
// there long, such as a message from before dual write.
func (w *watch) sampleQueue(ctx context.Context, gw *groupWatch) error {
	g := gw.g
	if g.Queue == "" {
		return nil
	}
	c := Condition{Group: g.Name(), Name: CondQueue}
	st, err := w.q.state(ctx, g.Queue)
	gw.queueRead = err == nil && st.exists
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		c.Detail = "cannot read queue " + g.Queue + ": " + err.Error()
	case !st.exists:
		c.Detail = fmt.Sprintf("queue %s does not exist: if the group's legacy side is gone with it, name the group without its queue", g.Queue)
	case g.switching():
		c.OK = st.messages == 0 && st.consumers == 0
		c.Detail = fmt.Sprintf("queue %s: %d ready, %d consumers", g.Queue, st.messages, st.consumers)
		if st.messages > 0 && st.consumers == 0 {
			c.Detail += "; if the group has switched, name it without its queue (dual write fills it with copies)"
		}
	default:
		gw.emptySeen = gw.emptySeen || st.messages == 0
		c.OK = gw.emptySeen
		c.Detail = fmt.Sprintf("queue %s: %d ready, %d consumers (dual read: they read JetStream too)", g.Queue, st.messages, st.consumers)
		if st.messages > 0 && gw.emptySeen {
			c.Detail += "; seen empty during the check"
		}
		if st.messages > 0 && st.consumers == 0 {
			c.Detail += "; with its legacy side stopped, name the group without its queue (dual write fills it with copies)"
		}
	}
	gw.queue = c
	return nil
}

// sampleConsumer reads a group's stream and consumer, fresh, and sets its
// consumer condition: for a rolling-upgrade group the verdict (nothing
// pending, nothing unacked), for a dual-read one whether it is of a kind that
// can be checked. ci is nil when the consumer could not be read.
func (w *watch) sampleConsumer(ctx context.Context, gw *groupWatch) (*jetstream.StreamInfo, *jetstream.ConsumerInfo) {
	g := gw.g
	c := Condition{Group: g.Name(), Name: CondConsumer}
	gw.kindOK = false
	si, ci, err := readConsumer(ctx, w.cfg.JS, g.Stream, g.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		c.Detail = fmt.Sprintf("stream %s does not exist", g.Stream)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		c.Detail = fmt.Sprintf("consumer %s does not exist on stream %s", g.Consumer, g.Stream)
	case err != nil:
		// In a cluster, the stream's or the consumer's leader lost and a new
		// one not yet elected (4 to 9 s): not holding, so --wait asks again.
		c.Detail = "cannot read: " + err.Error()
	// Its figures say what the application has processed only if it acks
	// (with AckNone, ack pending is 0 while messages are in its hands) and
	// it outlives a restart (an ephemeral one goes, and the application's
	// next one starts wherever it is told).
	case ci.Config.AckPolicy == jetstream.AckNonePolicy:
		c.Detail = fmt.Sprintf("consumer %s does not ack (AckNone): its ack pending is always 0, whatever the application has processed; the application's consumer must ack", g.Consumer)
	case ci.Config.Durable == "":
		c.Detail = fmt.Sprintf("consumer %s is not durable: the application's consumer must be, or its position goes with it", g.Consumer)
	default:
		gw.kindOK = true
		c.OK = ci.NumPending == 0 && ci.NumAckPending == 0
		c.Detail = fmt.Sprintf("consumer %s: pending %d, ack pending %d, redelivered %d, delivered stream seq %d, ack floor %d, stream last seq %d",
			g.Consumer, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.Delivered.Stream, ci.AckFloor.Stream, si.State.LastSeq)
	}
	gw.consumer = c
	if err != nil {
		return nil, nil
	}
	return si, ci
}

// readConsumer reads the stream's and the consumer's info, fresh.
func readConsumer(ctx context.Context, js jetstream.JetStream, stream, consumer string) (*jetstream.StreamInfo, *jetstream.ConsumerInfo, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	cons, err := st.Consumer(ctx, consumer)
	if err != nil {
		return nil, nil, fmt.Errorf("consumer %s: %w", consumer, err)
	}
	ci, err := cons.Info(ctx) // fresh, not CachedInfo
	if err != nil {
		return nil, nil, fmt.Errorf("consumer %s: %w", consumer, err)
	}
	return si, ci, nil
}
