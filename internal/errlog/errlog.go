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

// PerKey rate-limits a warning that repeats for each of many keys (a topic,
// a subject): at once for a key, then at most once per key every Every,
// with the count it left out. It remembers at most Max keys. Safe for
// concurrent use.
type PerKey struct {
	log *slog.Logger
	now func() time.Time
	max int

	mu         sync.Mutex
	last       map[string]time.Time // key -> when it was last warned of
	suppressed map[string]int
}

// NewPerKey returns a limiter that remembers at most max keys.
func NewPerKey(log *slog.Logger, max int) *PerKey {
	return &PerKey{log: log, now: time.Now, max: max, last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// Warn logs msg with args and the count suppressed, unless key was warned
// of within Every.
func (p *PerKey) Warn(key, msg string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if at, ok := p.last[key]; ok && now.Sub(at) < Every {
		p.suppressed[key]++
		return
	}
	if len(p.last) >= p.max {
		p.forget(now)
	}
	p.log.Warn(msg, append(args, "suppressed", p.suppressed[key])...)
	p.last[key] = now
	delete(p.suppressed, key)
}

// forget drops the keys not warned of within Every, and all of them if that
// leaves the map full: a flood of distinct keys costs at most one line each
// per reset, never unbounded memory.
func (p *PerKey) forget(now time.Time) {
	for key, at := range p.last {
		if now.Sub(at) >= Every {
			delete(p.last, key)
			delete(p.suppressed, key)
		}
	}
	if len(p.last) >= p.max {
		clear(p.last)
		clear(p.suppressed)
	}
}
