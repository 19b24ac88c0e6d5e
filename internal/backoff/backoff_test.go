package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDoubling(t *testing.T) {
	d := Doubling{Floor: 100 * time.Millisecond, Cap: time.Second}
	for _, tc := range []struct {
		prev, want time.Duration
	}{
		{0, 100 * time.Millisecond},
		{10 * time.Millisecond, 100 * time.Millisecond},
		{100 * time.Millisecond, 200 * time.Millisecond},
		{400 * time.Millisecond, 800 * time.Millisecond},
		{800 * time.Millisecond, time.Second},
		{time.Second, time.Second},
	} {
		if got := d.Next(tc.prev); got != tc.want {
			t.Errorf("Next(%v) = %v, want %v", tc.prev, got, tc.want)
		}
	}
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, time.Second}, {60, time.Second}} {
		if got := d.Attempt(tc.n); got != tc.want {
			t.Errorf("Attempt(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestWaitJitterStaysWithinItsFraction(t *testing.T) {
	d := Doubling{Jitter: 0.25}
	for range 1000 {
		if w := d.Wait(time.Second); w > time.Second || w < 750*time.Millisecond {
			t.Fatalf("Wait(1s) with jitter 0.25 = %v", w)
		}
	}
	if w := (Doubling{}).Wait(time.Second); w != time.Second {
		t.Fatalf("Wait without jitter = %v", w)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on a done context said the wait passed")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep of 1ms did not pass")
	}
}
