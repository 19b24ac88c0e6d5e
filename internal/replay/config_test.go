package replay

import (
	"math"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// A batch is a tenth of a second at the rate, at most BatchSize: a rate
// too large for an int (or unlimited) keeps the full batch rather than
// collapse to one message a batch.
func TestBatchSizeFollowsTheRate(t *testing.T) {
	pool := new(pgxpool.Pool) // only checked for nil
	for _, tc := range []struct {
		rate float64
		want int
	}{
		{0, 200}, // DefaultRate
		{5, 1},
		{2000, 200},
		{1e6, DefaultBatchSize},
		{1e30, DefaultBatchSize},
		{math.Inf(1), DefaultBatchSize},
	} {
		c := Config{DB: pool, JS: fakeJS{}, Stream: "S", DryRun: true, Rate: tc.rate}
		if err := c.applyDefaults(); err != nil {
			t.Fatalf("rate %v: %v", tc.rate, err)
		}
		if c.BatchSize != tc.want {
			t.Errorf("rate %v: batch size %d, want %d", tc.rate, c.BatchSize, tc.want)
		}
	}
	c := Config{DB: pool, JS: fakeJS{}, Stream: "S", DryRun: true, Rate: math.NaN()}
	if err := c.applyDefaults(); err == nil {
		t.Errorf("rate NaN taken")
	}
}

// fakeJS is a jetstream.JetStream that is not nil.
type fakeJS struct{ jetstream.JetStream }
