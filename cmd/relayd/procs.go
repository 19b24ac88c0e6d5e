package main

import (
	"strconv"

	"github.com/sethvargo/go-envconfig"
)

// defaultProcs is relayd's GOMAXPROCS unless the GOMAXPROCS variable sets
// it. relayd waits on Postgres and the brokers far more than it computes:
// it needs a fraction of a core (0.2–0.5 core-seconds per 10,000 rows,
// docs/performance.md), and one core moves tens of thousands of rows a
// second. More Ps buy it nothing and cost the host CPU: with a P per core,
// every hand-off between relayd's goroutines (the AMQP reader, the NATS
// reader, the workers) wakes a spinning thread, and on the 2-core bench
// machine, shared with Postgres, RabbitMQ and NATS, relayd spent a fifth of
// its CPU in the scheduler and took that CPU from the brokers. With one P
// the backfill moved 24–68 % more messages a second and dual write 7–27 %
// more rows (cmd/relayd-bench, docs/performance.md).
const defaultProcs = 1

// procs returns the GOMAXPROCS relayd should set: defaultProcs when the
// variable is not set (or empty); 0, leave it, when it is a whole number of
// at least 1 (the runtime read it at start); and a config error naming the
// variable for anything else, which the Go runtime would silently ignore.
func procs(l envconfig.Lookuper) (int, error) {
	v, ok := l.Lookup("GOMAXPROCS")
	if !ok || v == "" {
		return defaultProcs, nil
	}
	// As the runtime reads it: base 10, 32 bits, no spaces, no sign.
	if n, err := strconv.ParseInt(v, 10, 32); err != nil || n < 1 || v[0] == '+' {
		return 0, badVar("GOMAXPROCS", "%q is not a whole number of at least 1", v)
	}
	return 0, nil
}
