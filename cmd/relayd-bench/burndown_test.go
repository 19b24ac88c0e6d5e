package main

import (
	"testing"
	"time"
)

// A burn-down is timed to its last row's done_at, not to the poll that
// noticed it: the poll comes up to a tick later, 3 % of a 3-second run.
func TestDrainTimeIsTheLastRowsDoneAt(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	got, err := drainTime(t0, t0.Add(3020*time.Millisecond), 3100*time.Millisecond)
	if err != nil || got != 3020*time.Millisecond {
		t.Errorf("drainTime = %v, %v; want 3.02s, nil", got, err)
	}
	for _, c := range []struct {
		name string
		done time.Duration
		seen time.Duration
	}{
		{"done before the start", -time.Millisecond, time.Second},
		{"done at the start", 0, time.Second},
		{"done long after it was seen", 5 * time.Second, 3 * time.Second},
	} {
		if got, err := drainTime(t0, t0.Add(c.done), c.seen); err == nil {
			t.Errorf("%s: drainTime = %v, want an error", c.name, got)
		}
	}
}
