package relay

import "sync"

// reconnectSignal wakes every worker stalled after a failed batch when the
// listener has connected to Postgres again: after a failover their backoff
// would otherwise keep the relay idle long after the new primary took writes.
type reconnectSignal struct {
	mu sync.Mutex
	ch chan struct{} // signal closes it and puts a new one; wait hands it to workers
}

func newReconnectSignal() *reconnectSignal { return &reconnectSignal{ch: make(chan struct{})} }

// wait returns a channel closed at the next reconnection.
func (r *reconnectSignal) wait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

// signal wakes every worker waiting.
func (r *reconnectSignal) signal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.ch)
	r.ch = make(chan struct{})
}
