package backfill

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/jspub"
)

// retries collects the items of an attempt that could not move for now,
// with the first reason.
type retries struct {
	items []*item
	err   error
}

func (r *retries) add(it *item, err error) {
	it.retried(err)
	r.items, r.err = append(r.items, it), cmp.Or(r.err, err)
}

// settle makes one attempt at items (see process) and returns those that
// could not move for now, with the first reason.
func (b *runner) settle(ctx context.Context, acks *acker, items []*item, dlq *deadLetter) ([]*item, error) {
	wctx, cancel := b.settleBudget(ctx)
	defer func() { cancel() }()

	known, err := b.known(wctx, items)
	if err != nil {
		b.log.Debug("backfill: cannot read the relay's record of delivered ids; trying again", "error", err.Error())
		return items, err
	}
	var r retries
	toPublish := b.settleKnown(wctx, acks, items, known, dlq, &r)
	if len(toPublish) == 0 {
		return r.items, r.err
	}
	if b.limiter != nil {
		for range toPublish {
			if err := b.limiter.Wait(ctx); err != nil {
				break // cancelled: publish this batch anyway, it is already ours
			}
		}
		// The budget starts after the wait: at a low rate the wait alone
		// is longer than the budget.
		cancel()
		wctx, cancel = b.settleBudget(ctx)
	}
	moved := b.publish(wctx, toPublish, dlq, &r)
	if len(moved) > 0 {
		b.ackMoved(wctx, acks, moved)
	}
	return r.items, r.err
}

// settleBudget bounds an attempt: a cancelled run still settles its batch.
func (b *runner) settleBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), b.cfg.PublishTimeout+10*time.Second)
}

// settleKnown acks the items JetStream already has, refuses those it can
// never take, and returns the rest, to publish.
func (b *runner) settleKnown(ctx context.Context, acks *acker, items []*item, known map[string]bool, dlq *deadLetter, r *retries) (toPublish []*item) {
	var knownItems []*item
	var already []settled
	for _, it := range items {
		switch {
		case known[it.id]:
			already = append(already, settled{it.d, func() { b.already.Add(1) }})
			it.endSpan("already_delivered", "")
			knownItems = append(knownItems, it)
		case it.bad != "":
			if err := b.refuse(ctx, it, it.bad, dlq); err != nil {
				r.add(it, err)
			}
		default:
			toPublish = append(toPublish, it)
		}
	}
	acks.ackAll(already)
	b.forgetRetries(knownItems)
	return toPublish
}

// publish sends items to JetStream and returns those it acked. It refuses
// those JetStream will never take, and adds the rest to r.
func (b *runner) publish(ctx context.Context, items []*item, dlq *deadLetter, r *retries) (moved []*item) {
	pctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	msgs := make([]*nats.Msg, len(items))
	for i, it := range items {
		msgs[i] = it.msg // with its Nats-Msg-Id and Nats-Expected-Stream (prepare)
	}
	errs := make([]error, len(items))
	dups := make([]bool, len(items))
	b.pub.Publish(pctx, msgs, errs, dups)
	var dupIDs []string
	lookup := jspub.NewLookup(b.js)
	for i, it := range items {
		err := errs[i]
		if err == nil {
			moved = append(moved, it)
			if dups[i] {
				dupIDs = append(dupIDs, it.id)
			}
			continue
		}
		if reason := b.permanent(ctx, it, err, lookup); reason != "" {
			if err := b.refuse(ctx, it, reason, dlq); err != nil {
				r.add(it, err)
			}
			continue
		}
		err = cmp.Or(b.streamRefusal(ctx, it, err, lookup), err)
		b.log.Debug("backfill: publish failed, trying again", "message_id", it.id, "error", err.Error())
		r.add(it, err)
	}
	if len(dupIDs) > 0 {
		b.duplicates(dupIDs)
	}
	return moved
}

// ackMoved records the moved ids, then acks them: a crash between the two
// costs a skip on the rerun, not a duplicate. A record that keeps failing
// does not stop the ack: once acked, the message cannot come back.
func (b *runner) ackMoved(ctx context.Context, acks *acker, moved []*item) {
	b.forgetRetries(moved)
	if err := b.recordMoved(ctx, moved); err != nil {
		b.log.Warn("backfill: could not record moved ids; acking them (an ack lost now, or a crash before it, has a rerun publish them again)", "error", err.Error())
	}
	done := make([]settled, len(moved))
	for i, it := range moved {
		it.endSpan("moved", "")
		done[i] = settled{it.d, func() {
			b.moved.Add(1)
			if it.derived {
				b.derived.Add(1)
			}
		}}
	}
	acks.ackAll(done)
}

// duplicates counts ids JetStream already had (a repeat within its
// duplicate window, or two legacy messages sharing an id), and says so
// every retryWarnEvery at most.
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

// permanent says why err means JetStream will never take the message, or "".
// lookup asks JetStream the stream's MaxBytes, once a batch.
func (b *runner) permanent(ctx context.Context, it *item, err error, lookup *jspub.Lookup) string {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return "message exceeds the NATS server's max_payload"
	case errors.Is(err, nats.ErrBadHeaderMsg):
		return "a header NATS refuses"
	case errors.As(err, &apiErr) && apiErr.ErrorCode == 10054:
		return "message exceeds the stream's maximum message size"
	case errors.As(err, &apiErr) && apiErr.ErrorCode == 10077:
		stream := it.stream
		if stream == "" {
			stream = lookup.StreamOf(ctx, it.subject)
		}
		if maxBytes, tooLarge := lookup.TooLarge(ctx, stream, it.msg, err); tooLarge {
			return fmt.Sprintf("message of about %d bytes is larger than stream %q's MaxBytes %d", jspub.StoredSize(it.msg), stream, maxBytes)
		}
	}
	return ""
}

// streamRefusal names what the operator must fix when JetStream refused
// it for where its subject goes (jspub.WhereTo): the stream missing, or not
// capturing the subject. The messages wait, unacked, and are never
// dead-lettered for it; nil for other refusals, and while JetStream does
// not say (err says so).
func (b *runner) streamRefusal(ctx context.Context, it *item, err error, lookup *jspub.Lookup) error {
	switch jspub.WhereTo(ctx, lookup, err, it.subject, it.stream) {
	case jspub.WhereNoStream:
		return fmt.Errorf("JetStream has no stream %s: create it, and the messages move: %w", it.stream, err)
	case jspub.WhereNotCaptured, jspub.WhereOtherStream:
		if it.stream == "" {
			return fmt.Errorf("no stream captures subject %q: add the subject to one, and the messages move: %w", it.subject, err)
		}
		return fmt.Errorf("stream %s does not capture subject %q: add the subject to it, and the messages move: %w", it.stream, it.subject, err)
	}
	return nil
}
