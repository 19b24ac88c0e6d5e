// Package backoff holds the one doubling backoff and the one context-aware
// sleep that every retry loop in relayd uses, so that floors, caps and
// jitter are chosen per loop and written once.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Doubling is a backoff that starts at Floor, doubles, and stops growing at
// Cap. Jitter, between 0 and 1, takes up to that fraction off each wait at
// random, so that instances failing together do not retry together.
type Doubling struct {
	Floor, Cap time.Duration
	Jitter     float64
}

// Next is the wait after prev: Floor after no wait (prev zero), else twice
// prev, within [Floor, Cap]. Jitter is applied by Wait, not here, so that
// the sequence itself keeps doubling.
func (d Doubling) Next(prev time.Duration) time.Duration {
	return min(max(2*prev, d.Floor), d.Cap)
}

// Attempt is the wait before attempt n (1-based): Floor·2^(n-1), at most Cap.
func (d Doubling) Attempt(n int) time.Duration {
	w := d.Floor
	for i := 1; i < n && w < d.Cap; i++ {
		w *= 2
	}
	return min(w, d.Cap)
}

// Wait is w with the policy's jitter applied.
func (d Doubling) Wait(w time.Duration) time.Duration {
	if d.Jitter <= 0 || w <= 0 {
		return w
	}
	return w - time.Duration(rand.Float64()*d.Jitter*float64(w))
}

// Sleep waits d or until ctx is done, and says whether the whole wait passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
