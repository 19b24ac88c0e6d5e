// Package errlog keeps a loop's repeated errors from flooding the log: the
// first error of a run at once, then at most one line every 30 s with the
// count suppressed, and one line when the loop recovers. context.Canceled is
// never logged — it is how loops are asked to stop.
package errlog

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Every is the most often a failing loop logs.
const Every = 30 * time.Second

// Limiter rate-limits one loop's error logs. Safe for concurrent use.
type Limiter struct {
	log     *slog.Logger
	what    string
	now     func() time.Time
	mu      sync.Mutex
	failing bool
	last    time.Time
	dropped int
}

// New returns a limiter whose lines say "<what> failed" and "<what> recovered".
func New(log *slog.Logger, what string) *Limiter {
	return &Limiter{log: log, what: what, now: time.Now}
}

// Error records a failed pass.
func (l *Limiter) Error(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.failing && now.Sub(l.last) < Every {
		l.dropped++
		return
	}
	l.log.Error(l.what+" failed", "error", err.Error(), "suppressed", l.dropped)
	l.failing, l.last, l.dropped = true, now, 0
}

// OK records a successful pass.
func (l *Limiter) OK() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failing {
		l.log.Info(l.what+" recovered", "suppressed", l.dropped)
	}
	l.failing, l.dropped = false, 0
}
