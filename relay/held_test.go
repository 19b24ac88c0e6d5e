package relay

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// While a batch is in flight, the relay's next claims know its keyed rows
// (and do not try to lock them); once its transaction ends they are free.
func TestHeldKeyedRowsAreThoseOfBatchesInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keyOf := f.insertKeyed(4, 3)
	heads := map[string]int64{}
	for id, k := range keyOf {
		if h, ok := heads[k]; !ok || id < h {
			heads[k] = id
		}
	}
	var want []int64
	for _, id := range heads {
		want = append(want, id)
	}
	slices.Sort(want)
	r, err := New(f.pool, Config{Table: f.table, Sinks: []Sink{newFake(TargetAMQP)}, Workers: 1, BatchSize: 10, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var firstBatch []int64
	r.hooks = &testHooks{afterPublish: func() {
		mu.Lock()
		defer mu.Unlock()
		if firstBatch == nil {
			firstBatch = r.held.list()
			slices.Sort(firstBatch)
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(keyOf) }, "rows not delivered")
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(firstBatch, want) {
		t.Fatalf("held during the first batch: %v, want its rows, the keys' first rows %v", firstBatch, want)
	}
	if left := r.held.list(); len(left) != 0 {
		t.Fatalf("held after every batch ended: %v", left)
	}
}
