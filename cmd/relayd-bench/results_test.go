package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestCPUBound checks the bound against figures worked by hand: those of
// the 2026-11-30 late run on the 2-core Intel machine.
func TestCPUBound(t *testing.T) {
	ceil := func(key string, rate, busy float64) Ceiling {
		return Ceiling{Key: key, Rate: rate, CPU: &CPUSplit{BusyPercent: busy}}
	}
	r := &Results{}
	for _, c := range []Ceiling{
		ceil(ceilJetStream, 105322, 84),
		ceil(ceilAMQPRelayd, 16103, 68),
		ceil(ceilAMQPConsume, 58337, 83),
		ceil(ceilPostgres, 135625, 91),
	} {
		r.addCeiling(c)
	}
	r.Burndown = []Burndown{
		{Targets: "nats", Instances: 1, RowsPerSecond: 47915},
		{Targets: "amqp,nats", Instances: 1, RowsPerSecond: 10179},
		{Targets: "amqp,nats", Instances: 1, Keys: 1000, RowsPerSecond: 9468},
	}
	r.Backfill = &Backfill{Rate: 25352}
	r.evaluate()

	// The backfill consumes every message from RabbitMQ and publishes it to
	// JetStream: at the consume ceiling's rate that is 0.83 of the machine
	// for the consume and 0.84 × 58,337 / 105,322 = 0.465 for the publish,
	// 1.295 machines' worth; 1 / 1.295 = 0.77 of the ceiling at most.
	// nats: 1 / (0.84 + 0.91 × 105,322 / 135,625) = 0.65.
	// dual write: 1 / (0.68 + 0.84 × 16,103 / 105,322 + 0.91 × 16,103 / 135,625) = 1.09.
	for _, c := range []struct {
		what  string
		got   float64
		want  float64
		reach bool
	}{
		{"backfill", r.Backfill.Bound, 0.77, false},
		{"nats", r.Burndown[0].Bound, 0.65, true},
		{"amqp,nats", r.Burndown[1].Bound, 1.09, true},
	} {
		if c.got != c.want {
			t.Errorf("%s: bound %v, want %v", c.what, c.got, c.want)
		}
		v := r.verdictFor(map[string]string{"backfill": "backfill:", "nats": "burn-down nats ×1:", "amqp,nats": "burn-down amqp,nats ×1:"}[c.what])
		if v == nil {
			t.Fatalf("%s: no verdict", c.what)
		}
		if v.Bound != c.want || v.outOfReach() == c.reach || v.Pass {
			t.Errorf("%s: verdict %+v, want bound %v, out of reach %v, failing", c.what, *v, c.want, !c.reach)
		}
	}
	if b := r.Burndown[2].Bound; b != 0 {
		t.Errorf("keyed run: bound %v, want none (it is set against the null-key run)", b)
	}

	var out bytes.Buffer
	writeTable(&out, r)
	for _, want := range []string{
		"| 0.43 | 0.77 | ≥ 0.8 **FAIL (out of reach)** |",
		"| backfill: msg/s vs RabbitMQ consume ≥ 0.8 | 0.43 | FAIL: out of this machine's reach (its CPU allows at most 0.77) |",
		"| burn-down nats ×1: rows/s vs min(JetStream, Postgres) = JetStream publish ≥ 0.5 | 0.45 | FAIL |",
		"1 of 4 targets met; 1 beyond what this machine's CPU allows (CPU bound).",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}

	// A ceiling without its CPU (not Linux): no bound, and no claim.
	r.Ceilings[2].CPU = nil
	r.evaluate()
	if r.Backfill.Bound != 0 || r.verdictFor("backfill:").outOfReach() {
		t.Errorf("without the consume ceiling's CPU: bound %v, want none", r.Backfill.Bound)
	}
}
