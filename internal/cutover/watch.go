package cutover

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// watch is one check: the outbox's conditions and each group's, sampled
// until every group is settled or a condition stops holding.
type watch struct {
	cfg   Config
	q     *queues
	table []Condition // outbox, relayd phases: the latest sample, or the first failing one
	lag   time.Duration
	// What RabbitMQ is owed, unless the table is in phase nats (where rows
	// are owed to it no more): the oldest row's age, and the parked rows.
	amqpLag    time.Duration
	amqpParked int64
	amqpOff    bool
	groups     []*groupWatch
}

// groupWatch is one group's state through the watch.
type groupWatch struct {
	g        Group
	queue    Condition // unset (Name "") for a group without a queue
	consumer Condition
	quiet    Condition // rolling upgrade only
	// startSeq is the stream's last sequence at the start: a dual-read
	// consumer has caught up once it has acked up to it.
	startSeq uint64
	// delivered is a rolling-upgrade consumer's delivered consumer sequence
	// at the start: any delivery after it is a message on its subjects.
	delivered uint64
	period    time.Duration // quiet interval, or how long to wait for the catch-up
	// kindOK says the consumer could be read, is durable and acks; only
	// then is a dual-read consumer's catch-up watched.
	kindOK bool
	// queueRead says the queue exists and answered. A dual-read group's queue
	// is watched until seen empty (emptySeen): under load it rarely is at once.
	queueRead, emptySeen bool
	settled              bool
}

// begin takes the first sample and sets each group's period.
func (w *watch) begin(ctx context.Context) error {
	if err := w.sampleTable(ctx); err != nil {
		return err
	}
	for _, g := range w.cfg.Groups {
		gw := &groupWatch{g: g}
		w.groups = append(w.groups, gw)
		if err := w.sampleQueue(ctx, gw); err != nil {
			return err
		}
		si, ci := w.sampleConsumer(ctx, gw)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ci == nil {
			continue // its condition fails: settled below
		}
		if g.switching() {
			p, err := quietPeriod(w.cfg, g, ci.Config)
			if err != nil {
				return err
			}
			gw.period, gw.delivered = p, ci.Delivered.Consumer
		} else {
			gw.startSeq, gw.period = si.State.LastSeq, max(ackWait(ci.Config), time.Second)
			gw.settled = !gw.kindOK || (caughtUp(ci, gw.startSeq) && gw.queueDone())
			gw.consumer = dualReadVerdict(gw, ci, 0)
		}
	}
	if c := w.tableFailed(); c != nil {
		w.stopAll(fmt.Sprintf("not watched: %s fails", c.Name), true)
	}
	for _, gw := range w.groups {
		if c := gw.failed(); c != nil && !gw.settled {
			gw.stop(fmt.Sprintf("not watched: %s fails", c.Name), true)
		}
	}
	return nil
}

// stopAll settles every group still watched.
func (w *watch) stopAll(why string, skipped bool) {
	for _, gw := range w.groups {
		if !gw.settled {
			gw.stop(why, skipped)
		}
	}
}

// run samples until every group is settled, or a condition of the outbox
// stops holding.
func (w *watch) run(ctx context.Context) error {
	var total time.Duration
	for _, gw := range w.groups {
		if !gw.settled {
			total = max(total, gw.period)
		}
	}
	start := time.Now()
	t := time.NewTicker(w.cfg.Poll)
	defer t.Stop()
	for !w.settled() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		elapsed := time.Since(start)
		if err := w.sampleTable(ctx); err != nil {
			return err
		}
		if c := w.tableFailed(); c != nil {
			w.stopAll(fmt.Sprintf("%s stopped holding after %s: %s", c.Name, elapsed.Round(time.Millisecond), c.Detail), false)
			return nil
		}
		for _, gw := range w.groups {
			if !gw.settled {
				if err := w.step(ctx, gw, elapsed); err != nil {
					return err
				}
			}
		}
		if w.cfg.OnSample != nil {
			w.cfg.OnSample(elapsed, total)
		}
	}
	return nil
}

// step samples one unsettled group.
func (w *watch) step(ctx context.Context, gw *groupWatch, elapsed time.Duration) error {
	if err := w.sampleQueue(ctx, gw); err != nil {
		return err
	}
	_, ci := w.sampleConsumer(ctx, gw)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if c := gw.failed(); c != nil {
		gw.stop(fmt.Sprintf("%s stopped holding after %s: %s", c.Name, elapsed.Round(time.Millisecond), c.Detail), false)
		return nil
	}
	if ci == nil {
		return nil // stopped above: its condition failed
	}
	if !gw.g.switching() {
		gw.settled = (caughtUp(ci, gw.startSeq) && gw.queueDone()) || elapsed >= gw.period
		gw.consumer = dualReadVerdict(gw, ci, elapsed)
		if gw.settled && !gw.queueDone() {
			gw.queue.Detail += fmt.Sprintf("; never empty in %s (the consumer's AckWait): the legacy side is behind", gw.period)
		}
		return nil
	}
	switch {
	case ci.Delivered.Consumer != gw.delivered:
		gw.stop(fmt.Sprintf("consumer %s got %d messages after %s: its subjects are not quiet (pause the group's publishers)",
			gw.g.Consumer, ci.Delivered.Consumer-gw.delivered, elapsed.Round(time.Millisecond)), false)
	case elapsed < gw.period:
	case w.lag >= elapsed:
		// Rows the group's paused publishers wrote before the quiet
		// interval would reach its consumer after the switch.
		gw.stop(fmt.Sprintf("a row owed to JetStream since before the quiet interval (outbox lag %s): it may be this group's, and would reach the new consumer after the old ones had it",
			w.lag.Round(time.Millisecond)), false)
	case !w.amqpOff && (w.amqpParked > 0 || w.amqpLag >= elapsed):
		// One owed to RabbitMQ would reach the queue after the old
		// consumers stopped; the new consumer started past it.
		gw.stop(fmt.Sprintf("rows owed to RabbitMQ since before the quiet interval (amqp lag %s, parked %d): one may be this group's, and would reach its queue after the old consumers stopped, and never the new consumer",
			w.amqpLag.Round(time.Millisecond), w.amqpParked), false)
	default:
		gw.settled = true
		gw.quiet = Condition{Group: gw.g.Name(), Name: CondQuiet, OK: true,
			Detail: fmt.Sprintf("the conditions above held and consumer %s got no message for %s", gw.g.Consumer, gw.period)}
	}
	return nil
}

// stop settles a group whose watch ended without the verdict it waited
// for; skipped: it was not watched at all.
func (gw *groupWatch) stop(why string, skipped bool) {
	gw.settled = true
	if gw.g.switching() {
		gw.quiet = Condition{Group: gw.g.Name(), Name: CondQuiet, Detail: why, skipped: skipped}
		return
	}
	if gw.kindOK && !gw.consumer.OK { // its catch-up was being watched
		gw.consumer.Detail = "not caught up: " + why
	}
	if gw.queueRead && !gw.queue.OK {
		gw.queue.Detail += "; not seen empty: " + why
	}
}

// caughtUp holds once the consumer has nothing pending or unacked, or has
// acked everything up to startSeq: under live traffic it is rarely idle.
func caughtUp(ci *jetstream.ConsumerInfo, startSeq uint64) bool {
	return (ci.NumPending == 0 && ci.NumAckPending == 0) || ci.AckFloor.Stream >= startSeq
}

// dualReadVerdict is a dual-read consumer's condition from its latest
// sample: one that does not ack or is not durable has failed already.
func dualReadVerdict(gw *groupWatch, ci *jetstream.ConsumerInfo, elapsed time.Duration) Condition {
	c := gw.consumer
	if !gw.kindOK {
		return c
	}
	c.OK = caughtUp(ci, gw.startSeq)
	figures := fmt.Sprintf("ack floor %d, pending %d, ack pending %d, stream seq at the start %d",
		ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending, gw.startSeq)
	switch {
	case c.OK:
		c.Detail = fmt.Sprintf("consumer %s caught up: %s", gw.g.Consumer, figures)
	case elapsed >= gw.period:
		c.Detail = fmt.Sprintf("consumer %s behind after %s (its AckWait): %s", gw.g.Consumer, elapsed.Round(time.Millisecond), figures)
	default:
		c.Detail = fmt.Sprintf("consumer %s catching up: %s", gw.g.Consumer, figures)
	}
	return c
}

func (w *watch) settled() bool {
	for _, gw := range w.groups {
		if !gw.settled {
			return false
		}
	}
	return true
}

// tableFailed is the first of the outbox's conditions that does not hold.
func (w *watch) tableFailed() *Condition {
	for i := range w.table {
		if !w.table[i].OK {
			return &w.table[i]
		}
	}
	return nil
}

// queueDone reports whether a dual-read group's queue has been seen empty,
// or it has none.
func (gw *groupWatch) queueDone() bool { return gw.queue.Name == "" || gw.queue.OK }

// failed is the group's first point-in-time condition that does not hold:
// its queue (a dual-read one only if it cannot be read), a rolling-upgrade
// consumer, or a dual-read consumer's kind.
func (gw *groupWatch) failed() *Condition {
	if gw.queue.Name != "" && !gw.queue.OK && (gw.g.switching() || !gw.queueRead) {
		return &gw.queue
	}
	if !gw.consumer.OK && (gw.g.switching() || !gw.kindOK) {
		return &gw.consumer
	}
	return nil
}

// result is the verdict so far: the outbox's conditions and those checked
// once (versions, consumers named), then each group's.
func (w *watch) result(outbox []Condition) Result {
	res := Result{Groups: w.cfg.Groups, Conditions: append(append([]Condition(nil), w.table...), outbox...)}
	for _, gw := range w.groups {
		if gw.queue.Name != "" {
			res.Conditions = append(res.Conditions, gw.queue)
		}
		res.Conditions = append(res.Conditions, gw.consumer)
		if gw.g.switching() {
			q := gw.quiet
			if q.Name == "" {
				q = Condition{Group: gw.g.Name(), Name: CondQuiet, Detail: "not watched: the check was interrupted", skipped: true}
			}
			res.Conditions = append(res.Conditions, q)
			res.QuietPeriod = max(res.QuietPeriod, gw.period)
		}
	}
	res.QuietPeriodSeconds = res.QuietPeriod.Seconds()
	return res
}

// quietPeriod is a rolling-upgrade group's quiet interval.
func quietPeriod(cfg Config, g Group, cc jetstream.ConsumerConfig) (time.Duration, error) {
	if cfg.QuietPeriod > 0 {
		return cfg.QuietPeriod, nil
	}
	if cfg.Conservative {
		if cc.MaxAckPending < 1 {
			// Unlimited (-1): the bound would be 0, no quiet at all.
			return 0, configError("cutover: the conservative quiet interval is AckWait × (MaxAckPending + 1), and consumer %q has no MaxAckPending limit (%d): give the quiet interval", g.Consumer, cc.MaxAckPending)
		}
		return cc.AckWait * time.Duration(cc.MaxAckPending+1), nil
	}
	return ackWait(cc), nil
}

// ackWait is how long the consumer waits before it redelivers, at most:
// its AckWait, or its last BackOff step if longer.
func ackWait(cc jetstream.ConsumerConfig) time.Duration {
	p := cc.AckWait
	if n := len(cc.BackOff); n > 0 && cc.BackOff[n-1] > p {
		p = cc.BackOff[n-1]
	}
	return p
}
