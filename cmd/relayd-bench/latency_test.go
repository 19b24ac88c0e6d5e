package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Messages that had not arrived when the wait ended count with the time they
// waited: left out, a relay that fell behind would show the latencies of the
// few messages it managed to deliver, and could pass.
func TestLatencyCountsMessagesNotArrivedAsLowerBounds(t *testing.T) {
	const ms = int64(time.Millisecond)
	recs := map[string]*latencyRec{
		// Warm-up: not measured, and never arrived.
		"warm": {slot: 0, commit: 1 * ms},
	}
	for i := range 98 {
		recs[fmt.Sprint(i)] = &latencyRec{slot: 1 + i, commit: 100 * ms, natsAt: 105 * ms, amqpAt: 110 * ms}
	}
	// One at NATS only, one at neither.
	recs["nats-only"] = &latencyRec{slot: 99, commit: 200 * ms, natsAt: 204 * ms}
	recs["neither"] = &latencyRec{slot: 100, commit: 300 * ms}
	waitEnd := 5300 * ms

	var l Latency
	last := l.figures(recs, 1, waitEnd)
	if last != 300*ms {
		t.Errorf("last commit %v, want 300ms", time.Duration(last))
	}
	if l.Committed != 100 || l.Received != 98 || l.Missing != 2 || !l.LowerBounds {
		t.Fatalf("committed %d, received %d, missing %d, lower bounds %v; want 100, 98, 2, true",
			l.Committed, l.Received, l.Missing, l.LowerBounds)
	}
	// Sorted: 98 × 10 ms, then 5,000 and 5,100 ms (nearest rank: p99 is
	// the 99th).
	if l.P50Ms != 10 || l.P99Ms != 5000 || l.MaxMs != 5100 {
		t.Errorf("p50 %v, p99 %v, max %v ms; want 10, 5000, 5100", l.P50Ms, l.P99Ms, l.MaxMs)
	}
	// NATS had one of the two: 98 × 5 ms, 4 ms, and 5,000 ms.
	if l.NATSP99Ms != 5 || l.AMQPP99Ms != 5000 {
		t.Errorf("NATS p99 %v, RabbitMQ p99 %v ms; want 5, 5000", l.NATSP99Ms, l.AMQPP99Ms)
	}

	// Every message there: exact figures.
	recs["nats-only"].amqpAt = 212 * ms
	recs["neither"].natsAt, recs["neither"].amqpAt = 306*ms, 309*ms
	l = Latency{}
	l.figures(recs, 1, waitEnd)
	if l.Missing != 0 || l.LowerBounds || l.Received != 100 || l.P99Ms != 10 || l.MaxMs != 12 {
		t.Errorf("missing %d, lower bounds %v, received %d, p99 %v, max %v; want 0, false, 100, 10, 12",
			l.Missing, l.LowerBounds, l.Received, l.P99Ms, l.MaxMs)
	}
}

// A p99 that is only a lower bound cannot pass its target, and the tables
// say "at least".
func TestLatencyLowerBoundCannotPass(t *testing.T) {
	r := &Results{Latency: []Latency{
		{Rate: 1000, Committed: 100, Received: 100, P50Ms: 3, P90Ms: 6, P99Ms: 12, MaxMs: 20},
		{Rate: 5000, Committed: 100, Received: 99, Missing: 1, LowerBounds: true, P50Ms: 3, P90Ms: 6, P99Ms: 12, MaxMs: 20},
	}}
	r.evaluate()
	v1000, v5000 := r.verdictFor("latency p99 at 1,000/s"), r.verdictFor("latency p99 at 5,000/s")
	if v1000 == nil || v5000 == nil {
		t.Fatalf("verdicts: %+v", r.Targets)
	}
	if !v1000.Pass || v1000.AtLeast {
		t.Errorf("1,000/s, every message in: %+v, want a pass", *v1000)
	}
	if v5000.Pass || !v5000.AtLeast {
		t.Errorf("5,000/s, a message not in: %+v, want a fail, at least", *v5000)
	}
	var table bytes.Buffer
	writeTable(&table, r)
	for _, want := range []string{
		"| ≥ 3.0 ms | ≥ 6.0 ms | ≥ 12 ms | ≥ 20 ms | 99 (**1 not yet arrived when the wait ended**",
		"| latency p99 at 5,000/s, ms ≤ 100 | ≥ 12 | FAIL |",
		"| 3.0 ms | 6.0 ms | 12 ms | 20 ms | 100 |",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}
