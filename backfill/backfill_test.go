package backfill

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
)

// With --rate, the prefetch holds at most five minutes of messages: the
// rest of a 4,096 prefetch would wait unacked behind the limiter past
// RabbitMQ's consumer timeout (30 min by default) at a rate below 2.3 msg/s.
func TestRateCapsThePrefetch(t *testing.T) {
	for _, c := range []struct {
		rate float64
		want int
	}{{0, DefaultPrefetch}, {0.001, 1}, {0.5, 150}, {2, 600}, {100, DefaultPrefetch}} {
		cfg := Config{AMQPURL: "amqp://x", Queue: "q", NATS: &nats.Conn{}, Stream: "S", DB: &pgxpool.Pool{}, Rate: c.rate}
		if err := cfg.applyDefaults(); err != nil {
			t.Fatal(err)
		}
		if cfg.Prefetch != c.want {
			t.Errorf("rate %v: prefetch %d, want %d", c.rate, cfg.Prefetch, c.want)
		}
	}
}
