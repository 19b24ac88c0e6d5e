package replay

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/relay"
)

// retryBackoff spaces the tries of messages whose outcome was unknown.
var retryBackoff = backoff.Doubling{Floor: 100 * time.Millisecond, Cap: 5 * time.Second}

// transient reports whether a publish's error may go away by itself: the
// broker, not the message, is the problem (see relay.Sink).
func transient(err error) bool {
	return errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrOutOfRoom)
}

// publish sends b's messages and waits for their confirms, sending those
// with an unknown outcome again (same message id) until ctx is done. Each try
// has its own timeout, so a stopping run still hears what it sent confirmed.
func (r *runner) publish(ctx context.Context, b *batch) {
	var idx []int
	for i, it := range b.items {
		if it.skip == send {
			idx = append(idx, i)
		}
	}
	wait := retryBackoff.Next(0)
	for len(idx) > 0 {
		msgs := make([]*relay.Message, len(idx))
		for j, i := range idx {
			msgs[j] = b.items[i].msg
		}
		results := make([]error, len(msgs))
		tctx, cancel := context.WithTimeout(context.Background(), r.cfg.PublishTimeout)
		r.cfg.Sink.Publish(tctx, msgs, results)
		cancel()
		var again []int
		var first error
		for j, i := range idx {
			b.items[i].err = results[j]
			if results[j] != nil && transient(results[j]) {
				again = append(again, i)
				first = cmp.Or(first, results[j])
			}
		}
		if len(again) == 0 {
			return
		}
		r.warn("replay: RabbitMQ did not confirm some messages; sending them again", "messages", len(again), "error", first.Error())
		if !backoff.Sleep(ctx, wait) {
			return // interrupted: these stay unconfirmed
		}
		wait = retryBackoff.Next(wait)
		idx = again
	}
}
