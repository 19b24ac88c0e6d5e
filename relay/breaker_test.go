package relay

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	t.Parallel()
	var b breaker
	now := time.Now()
	if !b.allow(now) {
		t.Fatal("new breaker closed")
	}
	d1 := b.failure(now, "x")
	if d1 != 100*time.Millisecond || b.allow(now) || b.failure(now, "x") != 0 {
		t.Fatalf("first failure: open for %v; want 100ms, closed meanwhile, no double count", d1)
	}
	later := now.Add(d1)
	if !b.allow(later) {
		t.Fatal("breaker did not half-open after its wait")
	}
	if d2 := b.failure(later, "x"); d2 != 200*time.Millisecond {
		t.Fatalf("second failure: %v, want 200ms", d2)
	}
	for i := range 20 {
		later = later.Add(time.Hour)
		if d := b.failure(later, "x"); d > breakerMax {
			t.Fatalf("failure %d: %v over the cap", i, d)
		}
	}
	if !b.success() || !b.allow(later) {
		t.Fatal("success did not close the breaker")
	}
}
