package replay

import (
	"cmp"
	"context"
	"errors"
	"sync"
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
	for len(idx) > 0 {
		if !r.pause.wait(ctx) {
			return // interrupted: these stay unconfirmed
		}
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
			r.pause.ok()
			return
		}
		r.pause.failed()
		r.warn("replay: RabbitMQ refused or did not confirm some messages; sending them again once it takes them", "messages", len(again), "error", first.Error())
		idx = again
	}
}

// pause holds every batch back while RabbitMQ refuses them (a missing
// exchange, a lost connection): they try again together, at a doubling
// interval, rather than each close the channel on its own schedule.
type pause struct {
	mu    sync.Mutex
	until time.Time
	last  time.Duration
}

// failed moves the next try away, once per round of tries.
func (p *pause) failed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); !now.Before(p.until) {
		p.last = retryBackoff.Next(p.last)
		p.until = now.Add(p.last)
	}
}

func (p *pause) ok() {
	p.mu.Lock()
	p.last = 0
	p.mu.Unlock()
}

// wait returns when a try may go, false if ctx ends first.
func (p *pause) wait(ctx context.Context) bool {
	p.mu.Lock()
	d := time.Until(p.until)
	p.mu.Unlock()
	return d <= 0 || backoff.Sleep(ctx, d)
}
