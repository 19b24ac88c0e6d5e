package main

import (
	"strconv"

	"github.com/sethvargo/go-envconfig"
)

// defaultProcs is relayd's GOMAXPROCS unless the GOMAXPROCS variable sets
// it: relayd waits far more than it computes, and more Ps only wake
// spinning threads that take CPU from the brokers beside it
// (docs/performance.md, "One P").
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
