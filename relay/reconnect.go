package relay

import "sync"

// reconnected wakes every worker stalled after a failed batch when the
// listener has connected to Postgres again: after a failover the workers'
// backoff (up to batchRetry's cap) would otherwise keep the relay idle long
// after the new primary took writes.
type reconnected struct {
	mu sync.Mutex
	ch chan struct{}
}

func newReconnected() *reconnected { return &reconnected{ch: make(chan struct{})} }

// wait returns a channel closed at the next reconnection.
func (r *reconnected) wait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

// signal wakes every worker waiting.
func (r *reconnected) signal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.ch)
	r.ch = make(chan struct{})
}
