package errlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The first error of a run is logged, then at most one per 30s with the
// count suppressed, and one line on recovery; context.Canceled never.
func TestLimiter(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "cleanup")
	now := time.Unix(0, 0)
	l.now = func() time.Time { return now }
	lines := func() int { return strings.Count(buf.String(), "\n") }

	l.Error(context.Canceled)
	l.Error(fmt.Errorf("wrapped: %w", context.Canceled))
	if lines() != 0 {
		t.Fatalf("context.Canceled logged: %s", buf.String())
	}
	for range 100 {
		l.Error(errors.New("db down"))
		now = now.Add(100 * time.Millisecond)
	}
	if lines() != 1 {
		t.Fatalf("100 errors in 10s: %d lines, want 1:\n%s", lines(), buf.String())
	}
	now = now.Add(Every)
	l.Error(errors.New("db down"))
	if lines() != 2 || !strings.Contains(buf.String(), "suppressed=99") {
		t.Fatalf("after 30s: want a second line with suppressed=99:\n%s", buf.String())
	}
	l.OK()
	l.OK()
	if lines() != 3 || !strings.Contains(buf.String(), "cleanup recovered") {
		t.Fatalf("recovery: want one 'recovered' line:\n%s", buf.String())
	}
}

// One line per key at once, then none for that key for Every, however many
// come; the next line counts those left out. Another key is not held back
// by the first.
func TestPerKeyIsRateLimitedPerKey(t *testing.T) {
	var buf bytes.Buffer
	p := NewPerKey(slog.New(slog.NewTextHandler(&buf, nil)), 10)
	now := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return now }
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }

	p.Warn("orders.created", "refused", "topic", "orders.created")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "topic=orders.created") {
		t.Fatalf("after the first: %q, want one line naming the topic", got)
	}
	for range 5 {
		now = now.Add(time.Second)
		p.Warn("orders.created", "refused", "topic", "orders.created")
	}
	p.Warn("orders.paid", "refused", "topic", "orders.paid")
	if got := lines(); len(got) != 2 || !strings.Contains(got[1], "topic=orders.paid") {
		t.Fatalf("after repeats and a second key: %q, want the first line and one for orders.paid", got)
	}
	now = now.Add(Every)
	p.Warn("orders.created", "refused", "topic", "orders.created")
	if got := lines(); len(got) != 3 || !strings.Contains(got[2], "suppressed=5") {
		t.Fatalf("after %v: %q, want a third line with suppressed=5", Every, got)
	}
}

// However many distinct keys come, the limiter remembers a bounded number.
func TestPerKeyIsBounded(t *testing.T) {
	const most = 64
	p := NewPerKey(slog.New(slog.DiscardHandler), most)
	for i := range 3 * most {
		p.Warn(fmt.Sprint("k", i), "refused")
	}
	if n := len(p.last); n > most {
		t.Fatalf("%d keys remembered, want at most %d", n, most)
	}
}
