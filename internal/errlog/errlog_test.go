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
