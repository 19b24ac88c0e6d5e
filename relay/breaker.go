package relay

import (
	"sync"
	"time"
)

// breaker pauses a target after batches in which every publish failed for
// want of the broker: 100ms doubling to 30s. It closes on the first batch
// with a delivery.
type breaker struct {
	mu        sync.Mutex
	failures  int
	openUntil time.Time
	lastErr   string
}

// failing reports how many batches in a row failed for want of the broker,
// and the last error; 0 when the last batch delivered, or the last pause
// ended more than probe ago with no batch since to tell.
func (b *breaker) failing(now time.Time, probe time.Duration) (int, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures > 0 && now.After(b.openUntil.Add(probe)) {
		return 0, ""
	}
	return b.failures, b.lastErr
}

const breakerMax = 30 * time.Second

func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !now.Before(b.openUntil)
}

func (b *breaker) wait(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.openUntil.Sub(now)
}

// failure opens the breaker and returns for how long, or 0 if it was already
// open (another worker's batch failed at the same time).
func (b *breaker) failure(now time.Time, err string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastErr = err
	if now.Before(b.openUntil) {
		return 0
	}
	d := breakerMax
	if b.failures < 9 {
		d = min(breakerMax, 100*time.Millisecond<<b.failures)
	}
	b.failures++
	b.openUntil = now.Add(d)
	return d
}

// success closes the breaker and reports whether it had failures.
func (b *breaker) success() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	had := b.failures > 0
	b.failures = 0
	b.openUntil = time.Time{}
	return had
}
