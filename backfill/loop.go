package backfill

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/jspub"
)

const (
	batchMax  = 256
	batchWait = 20 * time.Millisecond
	parallel  = 4 // batches in flight at once

	// DefaultPrefetch is Config.Prefetch's default: enough unacked
	// deliveries for every parallel batch to be full, one more filling, and
	// RabbitMQ streaming the next ones meanwhile. A prefetch below
	// (parallel+1) × batchMax starves the pipeline: with 1,000 (the old
	// default) the 200,000-message bench moved 10,000–15,000 msg/s, with
	// 4,096 14,000–19,500 on the same machine.
	DefaultPrefetch = 4 * parallel * batchMax
)

// testHookFlush, when set, sees the deliveries received and not yet
// settled each time a batch is handed on.
var testHookFlush func(inFlight int64)

// errLost means the RabbitMQ connection went away mid-run: reconnect.
var errLost = errors.New("amqp connection lost")

// errNotDrained means the session stopped at a drained queue or at the
// limit, then had to requeue messages that could not move for now: go on.
var errNotDrained = errors.New("requeued after the drain")

// loop runs sessions, reconnecting with capped backoff, until one ends the
// run.
func (b *runner) loop(ctx context.Context) error {
	backoff := time.Duration(0)
	var permanentSince time.Time // since when every session met permanentAMQP
	for {
		err := b.session(ctx)
		if errors.Is(err, errNotDrained) {
			backoff, permanentSince = 0, time.Time{}
			continue
		}
		if !errors.Is(err, errLost) {
			b.progress()
			return err
		}
		if ae := (*amqp.Error)(nil); errors.As(err, &ae) && permanentAMQP(ae.Code) {
			// The queue deleted, the user's rights revoked: reconnecting
			// would meet the same answer every 10 s, for ever. But a
			// cluster node restarting answers so for a while too (a
			// classic queue's home node down: NOT_FOUND; a vhost still
			// starting: NOT_ALLOWED).
			if permanentSince.IsZero() {
				permanentSince = time.Now()
			}
			if time.Since(permanentSince) >= permanentAfter {
				b.progress()
				return fmt.Errorf("%w (RabbitMQ's answer for %s)", err, permanentAfter)
			}
		} else {
			permanentSince = time.Time{}
		}
		backoff = min(max(2*backoff, 200*time.Millisecond), 10*time.Second)
		b.log.Warn("backfill: reconnecting to RabbitMQ", "in", backoff.String(), "error", err.Error())
		select {
		case <-ctx.Done():
			b.progress()
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}

// permanentAMQP says whether a RabbitMQ error code means the run cannot go
// on — no such queue or virtual host, or access refused — when RabbitMQ
// keeps giving it for permanentAfter.
func permanentAMQP(code int) bool {
	switch code {
	case amqp.NotFound, amqp.AccessRefused, amqp.NotAllowed:
		return true
	}
	return false
}

// arrival is a delivery and when it came.
type arrival struct {
	d  amqp.Delivery
	at time.Time
}

// permanentAfter is how long RabbitMQ must keep giving a permanentAMQP
// answer for the run to stop.
const permanentAfter = 30 * time.Second

// session consumes on one connection. It returns nil when the run is over
// (drained, limit), ctx's error on cancel, or errLost.
func (b *runner) session(ctx context.Context) error {
	// Deliveries come in large reads (amqpio): amqp091-go alone reads the
	// socket every 4 KiB, three deliveries of 1 KiB.
	conn, err := amqp.DialConfig(b.cfg.AMQPURL, amqp.Config{TLSClientConfig: b.cfg.TLS, Dial: amqpio.Dial(30*time.Second, nil, nil)})
	if err != nil {
		return fmt.Errorf("%w: %w", errLost, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("%w: %w", errLost, err)
	}
	if err := ch.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("%w: %w", errLost, err)
	}
	var dlq *deadLetter
	var dlqClosed, dlqGone chan *amqp.Error // nil without a dead-letter queue: never ready
	if b.cfg.DeadLetterQueue != "" {
		dch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("%w: %w", errLost, err)
		}
		if err := dch.Confirm(false); err != nil {
			return fmt.Errorf("%w: %w", errLost, err)
		}
		dlq = &deadLetter{ch: dch, returns: dch.NotifyReturn(make(chan amqp.Return, 64))}
		// RabbitMQ may close the channel alone (a channel error): every
		// dead-letter publish would fail for the rest of the session.
		dlqClosed = dch.NotifyClose(make(chan *amqp.Error, 1))
		dlqGone = dch.NotifyClose(make(chan *amqp.Error, 1))
	}
	const tag = "relayd-backfill"
	deliveries, err := ch.ConsumeWithContext(ctx, b.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("%w: consume: %w", errLost, err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	acks := newAcker(ch)
	// sctx ends with the session — the connection, the consumer's channel
	// or the dead-letter channel gone: batches trying messages again in
	// place (process) stop, and what they keep goes back to the queue.
	// Watched apart from the loop below, which waits in flush while every
	// batch is trying again.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	connGone, chGone := conn.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		select {
		case <-connGone:
		case <-chGone:
		case <-dlqGone:
		case <-sctx.Done():
		}
		scancel()
	}()
	// Each delivery is stamped as it comes, apart from the loop below —
	// which may wait in flush while RabbitMQ goes on delivering — so that a
	// batch's time to retry in place counts from its first delivery's
	// coming, not from when the loop got to it. The buffer holds the
	// prefetch: only unacked deliveries are in it, so the stamping never
	// waits for the loop.
	stamped := make(chan arrival, max(b.cfg.Prefetch, 1))
	go func() {
		defer close(stamped)
		for d := range deliveries {
			select {
			case stamped <- arrival{d, time.Now()}:
			case <-sctx.Done():
				return // the session is over: unacked, they go back with it
			}
		}
	}()

	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, parallel)
		// batches bounds the batches on their way, tried or waiting for
		// a slot of sem: 4 × parallel.
		batches  = make(chan struct{}, 4*parallel)
		inFlight atomic.Int64 // deliveries received and not yet settled
		// reserved: deliveries taken toward Limit — counting what earlier
		// sessions of the run settled (what they had not is redelivered).
		reserved    = b.moved.Load() + b.already.Load() + b.dead.Load()
		batch       = make([]amqp.Delivery, 0, batchMax)
		batchFrom   time.Time // when batch's first delivery came
		flushT      = time.NewTimer(time.Hour)
		checkT      = time.NewTicker(250 * time.Millisecond)
		stopping    = false
		drainedStop = false
		limitStop   = false
		endErr      error
	)
	defer checkT.Stop()
	defer flushT.Stop()
	// taken: deliveries toward Limit, less those requeued to try again
	// (they come back, and count then).
	requeued0 := b.requeued.Load()
	taken := func() int64 { return reserved - (b.requeued.Load() - requeued0) }
	flush := func() {
		if len(batch) == 0 {
			return
		}
		items, from := slices.Clone(batch), batchFrom // a batch of one does not keep 256 deliveries' room
		batch = batch[:0]
		if testHookFlush != nil {
			testHookFlush(inFlight.Load())
		}
		// A batch takes a slot of sem for each attempt (process), not for
		// its waits between attempts, when the others use it; up to
		// 4 × parallel batches are on their way at once.
		batches <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-batches }()
			b.process(sctx, acks, items, dlq, from, sem)
			inFlight.Add(-int64(len(items)))
			b.progress()
		}()
	}
	stop := func(err error) {
		if err != nil {
			scancel() // the run ends: nothing is tried again
		}
		if !stopping {
			stopping, endErr = true, err
			ch.Cancel(tag, false) //nolint:errcheck // the channel closes below anyway
		}
	}

	for !stopping {
		select {
		case <-ctx.Done():
			stop(ctx.Err())
		case e := <-closed:
			flush()
			wg.Wait()
			return fmt.Errorf("%w: %v", errLost, e)
		case e := <-dlqClosed:
			scancel()
			flush()
			wg.Wait()
			return fmt.Errorf("%w: dead-letter channel: %v", errLost, e)
		case a, ok := <-stamped:
			if !ok {
				scancel()
				flush()
				wg.Wait()
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// The stamping stops when the session is lost: say why,
				// if the connection or dead-letter channel told.
				select {
				case e := <-closed:
					return fmt.Errorf("%w: %v", errLost, e)
				case e := <-dlqClosed:
					return fmt.Errorf("%w: dead-letter channel: %v", errLost, e)
				default:
				}
				return fmt.Errorf("%w: consumer closed", errLost)
			}
			d := a.d
			if b.cfg.Limit > 0 && taken() >= b.cfg.Limit {
				acks.requeue(d) //nolint:errcheck // beyond the limit: back to the queue
				limitStop = true
				stop(nil)
				continue
			}
			reserved++
			inFlight.Add(1)
			batch = append(batch, d)
			if len(batch) == 1 {
				batchFrom = a.at
				flushT.Reset(batchWait)
			}
			if len(batch) >= batchMax {
				flush()
			}
		case <-flushT.C:
			flush()
		case <-checkT.C:
			flush()
			if !b.cfg.DryRun && time.Since(b.lastDualWrite) >= dualWriteRecheck {
				b.lastDualWrite = time.Now()
				if err := b.checkDualWrite(ctx); errors.Is(err, ErrNotDualWrite) {
					b.log.Error("backfill: stopping: a relayd instance is not in dual write; messages of its rows in flight that this run skipped may not reach JetStream", "error", err.Error())
					stop(err)
					continue
				} else if err != nil {
					b.log.Warn("backfill: cannot check that the relays are in dual write", "error", err.Error())
				}
			}
			if b.cfg.Limit > 0 && taken() >= b.cfg.Limit && inFlight.Load() == 0 {
				limitStop = true
				stop(nil)
				continue
			}
			// Held messages take the whole prefetch: RabbitMQ delivers
			// nothing more, and the queue would never drain.
			if n := acks.heldCount(); n >= b.cfg.Prefetch {
				stop(fmt.Errorf("%w: %d messages JetStream refuses for good hold the whole prefetch (%d); rerun with --dead-letter-queue", ErrHeldFull, n, b.cfg.Prefetch))
				continue
			}
			// Drained: nothing ready on the broker and nothing of ours in
			// flight. On a queue that keeps receiving (dual write on), that
			// moment comes as soon as the backfill has caught up. Nor just
			// after a requeue: RabbitMQ redelivers the message at once, and
			// on its way back to us it is neither ready nor in flight.
			if b.cfg.Follow || inFlight.Load() > 0 || time.Since(time.Unix(0, b.lastRequeue.Load())) < requeueSettle {
				continue
			}
			if drained, err := b.drained(conn); err == nil && drained {
				drainedStop = true
				stop(nil)
			}
		}
	}
	flush()
	wg.Wait()
	// Deliveries already on their way when the consumer was cancelled: the
	// broker counts them as unacked, not ready, so "0 ready" did not see
	// them. After a drain they are ours to finish; after a signal or the
	// limit they go back to the queue.
	var late []amqp.Delivery
	for collecting := true; collecting; {
		select {
		case a, ok := <-stamped:
			if !ok {
				collecting = false
				continue
			}
			late = append(late, a.d)
		case <-time.After(500 * time.Millisecond):
			collecting = false
		}
	}
	if drainedStop {
		if b.cfg.Limit > 0 {
			// Those past the limit go back.
			room := max(0, min(int64(len(late)), b.cfg.Limit-taken()))
			for _, d := range late[room:] {
				acks.requeue(d) //nolint:errcheck // beyond the limit: back to the queue
			}
			late = late[:room]
		}
		lateFrom := time.Now()
		for len(late) > 0 {
			n := min(len(late), batchMax)
			b.process(sctx, acks, late[:n], dlq, lateFrom, nil)
			late = late[n:]
		}
		b.progress()
		if ctx.Err() != nil {
			return ctx.Err() // interrupted: what could not move went back
		}
		if sctx.Err() != nil || ch.IsClosed() || conn.IsClosed() {
			// The session went meanwhile: acks of moved messages may be
			// lost with it, and they back in the queue. (sctx hears of it
			// through a goroutine: the channel's and connection's own
			// state comes first.)
			return fmt.Errorf("%w: while finishing the last deliveries", errLost)
		}
		if b.lastRequeue.Load() >= lateFrom.UnixNano() {
			// Some could not move for now and went back: not drained.
			return errNotDrained
		}
	}
	for _, d := range late {
		acks.requeue(d) //nolint:errcheck // returned to the queue
	}

	if limitStop && taken() < b.cfg.Limit {
		if ctx.Err() != nil {
			return ctx.Err() // interrupted short of the limit
		}
		// The limit was reached counting deliveries that then could not
		// move for now and went back: go on for the rest.
		return errNotDrained
	}
	if n := b.heldCount(); n > 0 {
		b.log.Warn("messages JetStream refused for good were returned to the queue; pass --dead-letter-queue to park them", "count", n)
	}
	return endErr
}

// drained reports whether the queue has no ready message — and, unless
// other consumers are allowed, no consumer but this one: after a reconnect,
// the consumer of a connection that died without a close (a reset, a
// partition) still holds its unacked deliveries until the broker notices,
// up to the whole prefetch; they come back to the queue then, and a run that
// had stopped at "0 ready" would have left them there.
func (b *runner) drained(conn *amqp.Connection) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(b.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return false, err
	}
	if q.Messages == 0 && !b.cfg.AllowOtherConsumers && q.Consumers > 1 {
		if now := time.Now(); now.Sub(b.lastGhostWarn) >= retryWarnEvery {
			b.lastGhostWarn = now
			b.log.Warn("backfill: nothing ready, but another consumer is on the queue and may hold messages unacked (a connection of an earlier session not yet closed by RabbitMQ?); waiting for it to go",
				"queue", b.cfg.Queue, "consumers", q.Consumers)
		}
		return false, nil
	}
	return q.Messages == 0, nil
}

func (b *runner) heldCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seenHeld)
}

// process settles one batch: skip what JetStream already has, publish the
// rest, record and ack what JetStream acked, dead-letter or hold what it
// refuses for good, and try the rest again after a wait.
//
// What cannot move for now (JetStream down or full, Postgres down) stays
// unacked, ours, and is tried again here — not requeued: RabbitMQ counts
// each return of a message to a quorum queue against the queue's
// delivery-limit (20 by default from RabbitMQ 4.0) and drops or
// dead-letters it past that, so requeueing after each wait (5 s at most)
// lost messages in an outage of a minute or two. They are requeued when
// ctx ends (the run stops, or the session is gone) or retryInPlace after
// the batch's first delivery came (received), inside RabbitMQ's
// consumer_timeout (30 min by default, past which it closes the channel):
// one return per retryInPlace. Meanwhile they are kept (acker.keep): the
// acks of the deliveries after them go out, one by one — a message that
// alone cannot move (its dead-letter queue gone) does not stop the rest.
// Each attempt takes one of slots (nil: no limit) for its time, not the
// waits between attempts: while whole batches cannot move, every batch of
// the prefetch gets its attempts, and its time counts from its arrival.
func (b *runner) process(ctx context.Context, acks *acker, ds []amqp.Delivery, dlq *deadLetter, received time.Time, slots chan struct{}) {
	items := make([]*item, len(ds))
	for i, d := range ds {
		items[i] = b.prepare(d)
		items[i].acks = acks
	}
	for {
		if slots != nil && !b.takeSlot(ctx, slots, received.Add(retryInPlace)) {
			// Stopping, or kept its time while the slots were busy: back
			// to the queue, untried this time (nothing of it is sent).
			for _, it := range items {
				b.requeue(it)
			}
			return
		}
		retry, err := b.settle(ctx, acks, items, dlq)
		if slots != nil {
			<-slots
		}
		if len(retry) == 0 {
			return
		}
		for _, it := range retry {
			acks.keep(it.d)
		}
		sleepCtx(ctx, b.retryWait(retry, err))
		if ctx.Err() != nil || time.Since(received) >= retryInPlace {
			for _, it := range retry {
				b.requeue(it)
			}
			return
		}
		items = retry
	}
}

// takeSlot waits for a slot of slots, until ctx ends or the deadline
// passes: it says whether it took one.
func (b *runner) takeSlot(ctx context.Context, slots chan struct{}, deadline time.Time) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case slots <- struct{}{}:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// retryInPlace is how long after its batch's first delivery came a message
// that cannot move for now is kept and tried again before it goes back to
// the queue: a quorum queue's delivery-limit of 20 then lasts an outage of
// over three hours, and the message is back well before a consumer_timeout
// of 15 minutes or more closes the channel.
var retryInPlace = 10 * time.Minute

// settle makes one attempt at items (see process) and returns those that
// could not move for now, with the first reason.
func (b *runner) settle(ctx context.Context, acks *acker, items []*item, dlq *deadLetter) (retry []*item, retryErr error) {
	// A cancelled run still settles its batch: bounded by PublishTimeout.
	settleBudget := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), b.cfg.PublishTimeout+10*time.Second)
	}
	wctx, cancel := settleBudget()
	defer func() { cancel() }()

	known, err := b.known(wctx, items)
	if err != nil {
		b.log.Debug("backfill: cannot read the relay's record of delivered ids; trying again", "error", err.Error())
		return items, err
	}
	// What could not move for now is tried again after a wait (process): a
	// stream that is full refuses at once — without the wait, the run spun
	// through the same messages as fast as the three services could go.
	later := func(it *item, err error) { retry, retryErr = append(retry, it), cmp.Or(retryErr, err) }
	var toPublish, knownItems []*item
	var already []settled
	for _, it := range items {
		switch {
		case known[it.id]:
			already = append(already, settled{it.d, func() { b.already.Add(1) }})
			knownItems = append(knownItems, it)
		case it.bad != "":
			if err := b.refuse(wctx, it, it.bad, dlq); err != nil {
				later(it, err)
			}
		default:
			toPublish = append(toPublish, it)
		}
	}
	acks.ackAll(already)
	b.forgetRetries(knownItems)
	if len(toPublish) == 0 {
		return retry, retryErr
	}
	if b.limiter != nil {
		for range toPublish {
			if err := b.limiter.Wait(ctx); err != nil {
				break // cancelled: publish this batch anyway, it is already ours
			}
		}
		// The budget starts after the wait: at a low --rate a batch
		// waits longer than the budget, and every publish failed at once,
		// every batch, for ever.
		cancel()
		wctx, cancel = settleBudget()
	}

	pctx, pcancel := context.WithTimeout(wctx, b.cfg.PublishTimeout)
	defer pcancel()
	msgs := make([]*nats.Msg, len(toPublish))
	for i, it := range toPublish {
		msgs[i] = it.msg // with its Nats-Msg-Id and Nats-Expected-Stream (prepare)
	}
	errs := make([]error, len(toPublish))
	dups := make([]bool, len(toPublish))
	b.pub.Publish(pctx, msgs, errs, dups)
	var moved []*item
	var dupIDs []string
	lookup := jspub.NewLookup(b.js)
	for i, it := range toPublish {
		err := errs[i]
		if err == nil {
			moved = append(moved, it)
			if dups[i] {
				dupIDs = append(dupIDs, it.id)
			}
			continue
		}
		if reason := b.permanent(wctx, it, err, lookup); reason != "" {
			if err := b.refuse(wctx, it, reason, dlq); err != nil {
				later(it, err)
			}
			continue
		}
		b.log.Debug("backfill: publish failed, trying again", "message_id", it.id, "error", err.Error())
		later(it, err)
	}
	if len(moved) == 0 {
		return retry, retryErr
	}
	b.forgetRetries(moved)
	if len(dupIDs) > 0 {
		b.duplicates(dupIDs)
	}
	// Record before acking: a crash between the two then costs a skip on
	// the rerun, not a duplicate. A record that keeps failing does not
	// stop the ack — once acked, the message cannot come back.
	if err := b.recordMoved(wctx, moved); err != nil {
		b.log.Warn("backfill: could not record moved ids; acking them (an ack lost now, or a crash before it, has a rerun publish them again)", "error", err.Error())
	}
	done := make([]settled, len(moved))
	for i, it := range moved {
		done[i] = settled{it.d, func() {
			b.moved.Add(1)
			if it.derived {
				b.derived.Add(1)
			}
		}}
	}
	acks.ackAll(done)
	return retry, retryErr
}

// Waits before requeueing a message that could not move for now: 100 ms,
// doubling with each time the same message could not, up to 5 s.
const (
	retryWaitMin = 100 * time.Millisecond
	retryWaitMax = 5 * time.Second
	// retryWarnEvery spaces the warnings while messages cannot move.
	retryWarnEvery = 30 * time.Second
	// maxRetrying bounds the messages whose refusals are counted; past it,
	// a refusal waits retryWaitMin.
	maxRetrying = 100000
)

// retryWait counts a refusal of each of items, and returns how long the
// batch waits before requeueing them: the wait of its most refused message.
// Every retryWarnEvery at most, it says so, with err.
func (b *runner) retryWait(items []*item, err error) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	most := 0
	for _, it := range items {
		n := b.retrying[it.id] + 1
		if n > 1 || len(b.retrying) < maxRetrying {
			b.retrying[it.id] = n
		}
		most = max(most, n)
	}
	b.nRetrying.Store(int64(len(b.retrying)))
	if now := time.Now(); now.Sub(b.lastRetryWarn) >= retryWarnEvery {
		b.lastRetryWarn = now
		b.log.Warn("backfill: messages cannot move for now; trying them again after a wait (100 ms, doubling to 5 s for a message refused again; kept unacked, back to the queue 10 min after they came)",
			"messages", len(items), "error", err.Error())
	}
	if most >= 7 {
		return retryWaitMax
	}
	return min(retryWaitMax, retryWaitMin<<(most-1))
}

// duplicates counts ids JetStream already held, and says so every 30 s at
// most: a repeat of a message moved or delivered moments ago (a rerun after
// a crash, the relay's copy not yet recorded), or two legacy messages
// sharing an id — of which the stream keeps the first.
func (b *runner) duplicates(ids []string) {
	b.dups.Add(int64(len(ids)))
	b.mu.Lock()
	defer b.mu.Unlock()
	if now := time.Now(); now.Sub(b.lastDupWarn) >= retryWarnEvery {
		b.lastDupWarn = now
		b.log.Warn("backfill: JetStream already held these ids and kept its copy (a repeat within its duplicate window); two different messages sharing an id keep only the first",
			"messages", len(ids), "example", ids[0], "total", b.dups.Load())
	}
}

// forgetRetries forgets the refusals of items, settled for good (moved,
// already delivered, parked): kept, the map filled up to maxRetrying, past
// which a message refused again waits the shortest time.
func (b *runner) forgetRetries(items []*item) {
	if b.nRetrying.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, it := range items {
		delete(b.retrying, it.id)
	}
	b.nRetrying.Store(int64(len(b.retrying)))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (b *runner) requeue(it *item) {
	if err := it.acks.requeue(it.d); err == nil {
		b.requeued.Add(1)
	}
	b.lastRequeue.Store(time.Now().UnixNano())
}

// requeueSettle is how long after a requeue the queue is not taken as
// drained: far longer than RabbitMQ takes to redeliver to its consumer.
const requeueSettle = time.Second

// permanent says why err means JetStream will never take the message, or "".
// lookup asks JetStream whether a stream captures the subject, once a batch.
func (b *runner) permanent(ctx context.Context, it *item, err error, lookup *jspub.Lookup) string {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return "message exceeds the NATS server's max_payload"
	case errors.Is(err, nats.ErrBadHeaderMsg):
		return "a header NATS refuses"
	case errors.As(err, &apiErr) && apiErr.ErrorCode == 10054:
		return "message exceeds the stream's maximum message size"
	case errors.As(err, &apiErr) && apiErr.ErrorCode == 10060:
		return fmt.Sprintf("subject %q belongs to another stream than %q", it.subject, b.cfg.Stream)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == 10077:
		if maxBytes, tooLarge := lookup.TooLarge(ctx, b.cfg.Stream, it.msg, err); tooLarge {
			return fmt.Sprintf("message of about %d bytes is larger than stream %q's MaxBytes %d", jspub.StoredSize(it.msg), b.cfg.Stream, maxBytes)
		}
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse):
		// No stream for the subject — or JetStream restarting. Ask.
		if lookup.NoStream(ctx, it.subject) {
			return fmt.Sprintf("no stream captures subject %q", it.subject)
		}
	}
	return ""
}

// deadLetter is the session's channel to the dead-letter queue, in confirm
// mode, with its returns.
type deadLetter struct {
	ch      *amqp.Channel
	returns <-chan amqp.Return
	mu      sync.Mutex // one publish at a time: a return is its publish's
}

// publish puts pub in queue and waits for RabbitMQ to take it: confirmed,
// and not returned. Mandatory, so a queue deleted since the start comes
// back as a return — which RabbitMQ follows with an ack: that ack alone
// would have the source acked and the message gone from both brokers.
func (d *deadLetter) publish(ctx context.Context, queue string, pub amqp.Publishing) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.staleReturns()
	dc, err := d.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, pub)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("nacked")
	}
	// amqp091-go hands a return to its listener before it reads the
	// confirm that follows it: if this publish came back, it is buffered.
	for {
		select {
		case r, ok := <-d.returns:
			if !ok {
				return errors.New("dead-letter channel closed")
			}
			// Another publish's — one whose wait gave up, its message
			// requeued — unless the same message.
			if r.MessageId == pub.MessageId && bytes.Equal(r.Body, pub.Body) {
				return fmt.Errorf("returned: %d %s", r.ReplyCode, r.ReplyText)
			}
		default:
			return nil
		}
	}
}

// staleReturns drops the returns of publishes whose wait gave up (their
// messages were requeued), so that the buffer does not fill.
func (d *deadLetter) staleReturns() {
	for {
		select {
		case _, ok := <-d.returns:
			if !ok {
				return // the channel is closed: the publish says so
			}
		default:
			return
		}
	}
}

// refuse parks a message JetStream will never take: in the dead-letter
// queue (then ack), or held unacked for the rest of the session (the acks
// of the messages after it go out one by one).
func (b *runner) refuse(ctx context.Context, it *item, reason string, dlq *deadLetter) (retry error) {
	// Once a message: one whose dead-letter publish fails comes back here
	// every few seconds (process), and the wait's warning (retryWait) says
	// why every 30 s.
	b.mu.Lock()
	again := b.retrying[it.id] > 0
	b.mu.Unlock()
	level := slog.LevelWarn
	if again {
		level = slog.LevelDebug
	}
	b.log.Log(ctx, level, "backfill: JetStream refuses message for good", "message_id", it.id, "routing_key", it.d.RoutingKey, "reason", reason)
	if dlq == nil {
		it.acks.hold(it.d)
		b.mu.Lock()
		seen := b.seenHeld[it.id]
		b.seenHeld[it.id] = true
		b.mu.Unlock()
		if !seen {
			b.failed.Add(1)
		}
		b.forgetRetries([]*item{it})
		return nil // held: unacked until the session ends, then back in the queue
	}
	headers := amqp.Table{}
	for k, v := range it.d.Headers {
		headers[k] = v
	}
	headers[ReasonHeader] = reason
	headers[RoutingKeyHeader] = it.d.RoutingKey
	headers[ExchangeHeader] = it.d.Exchange
	if it.d.Expiration != "" {
		headers[ExpirationHeader] = it.d.Expiration
	}
	pub := amqp.Publishing{
		Headers: headers, ContentType: it.d.ContentType, ContentEncoding: it.d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: it.d.Priority, CorrelationId: it.d.CorrelationId,
		ReplyTo: it.d.ReplyTo, MessageId: it.d.MessageId, Timestamp: it.d.Timestamp, Type: it.d.Type,
		AppId: it.d.AppId, Body: it.d.Body,
	}
	if err := dlq.publish(ctx, b.cfg.DeadLetterQueue, pub); err != nil {
		b.log.Debug("backfill: dead-letter publish failed; trying again", "message_id", it.id, "error", err.Error())
		return fmt.Errorf("dead-letter publish: %w", err) // tried again after a wait (process), which says so
	}
	it.acks.ack(it.d, func() { b.dead.Add(1) })
	b.forgetRetries([]*item{it})
	return nil
}
