package backfill

import (
	"time"

	"github.com/relayd/relayd/internal/backoff"
)

// Waits before a message that could not move for now is tried again:
// retryWaitMin, doubling with each time the same message could not, up to
// retryWaitMax.
const (
	retryWaitMin = 100 * time.Millisecond
	retryWaitMax = 5 * time.Second
	// retryWarnEvery spaces the warnings while messages cannot move.
	retryWarnEvery = 30 * time.Second
	// maxRetrying bounds the messages whose refusals are counted; past it,
	// a refusal waits retryWaitMin.
	maxRetrying = 100000
)

var retryBackoff = backoff.Doubling{Floor: retryWaitMin, Cap: retryWaitMax}

// retryWait counts a refusal of each of items, and returns how long the
// batch waits before trying them again: the wait of its most refused
// message. Every retryWarnEvery at most, it says so, with err.
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
	return retryBackoff.Attempt(most)
}

// forgetRetries forgets the refusals of items, settled for good (moved,
// already delivered, dead-lettered or held), so that the count stays
// below maxRetrying.
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
