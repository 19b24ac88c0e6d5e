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
	// The targets are the ratio to the bound: 0.43 / 0.77, 0.45 / 0.65 and
	// 0.63 / 1.09.
	for _, c := range []struct {
		what                   string
		bound, wantBound, want float64
	}{
		{"backfill:", r.Backfill.Bound, 0.77, 0.56},
		{"burn-down nats ×1:", r.Burndown[0].Bound, 0.65, 0.69},
		{"burn-down amqp,nats ×1:", r.Burndown[1].Bound, 1.09, 0.58},
	} {
		if c.bound != c.wantBound {
			t.Errorf("%s: bound %v, want %v", c.what, c.bound, c.wantBound)
		}
		v := r.verdictFor(c.what)
		if v == nil {
			t.Fatalf("%s: no verdict", c.what)
		}
		if v.Value != c.want || v.Limit != 0.8 || v.Pass {
			t.Errorf("%s: verdict %+v, want %v of the bound, failing against 0.8", c.what, *v, c.want)
		}
	}
	if b := r.Burndown[2].Bound; b != 0 {
		t.Errorf("keyed run: bound %v, want none (it is set against the null-key run)", b)
	}

	var out bytes.Buffer
	writeTable(&out, r)
	for _, want := range []string{
		"| 0.43 | 0.77 | 0.56 of the bound, ≥ 0.8 **FAIL** |",
		"| backfill: msg/s vs CPU bound ≥ 0.8 | 0.56 | FAIL |",
		"| burn-down nats ×1: rows/s vs CPU bound ≥ 0.8 | 0.69 | FAIL |",
		"1 of 4 targets met.",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}

	// A ceiling without its CPU (not Linux): no bound, and no claim.
	r.Ceilings[2].CPU = nil
	r.evaluate()
	if r.Backfill.Bound != 0 || r.verdictFor("backfill:") != nil {
		t.Errorf("without the consume ceiling's CPU: bound %v and a verdict, want neither", r.Backfill.Bound)
	}
}

// TestReplayRow checks the replay's row: its rate set against the RabbitMQ
// publish ceiling for information, with no target, and the dry run's row.
func TestReplayRow(t *testing.T) {
	r := &Results{}
	r.addCeiling(Ceiling{Key: ceilAMQPRelayd, Rate: 16103})
	r.Replay = &Replay{Messages: 50000, RateFlag: 1_000_000, Rate: 8145, CPUSecondsPer10k: 0.17, PeakRSSMiB: 48.1,
		DryRun: &ReplayDryRun{Read: 50000, Rate: 47730, CPUSecondsPer10k: 0.13, PeakRSSMiB: 29}}
	r.evaluate()
	if r.Replay.Ratio != 0.51 {
		t.Errorf("ratio %v, want 0.51 (8,145 / 16,103)", r.Replay.Ratio)
	}
	if v := r.verdictFor("replay"); v != nil {
		t.Errorf("a replay target %+v, want none", *v)
	}
	if r.PeakRSSMiB != 48.1 {
		t.Errorf("peak RSS %v, want the replay's 48.1", r.PeakRSSMiB)
	}
	var out bytes.Buffer
	writeTable(&out, r)
	for _, want := range []string{
		"| replay, 50,000 messages the relay put in the stream in the nats-only phase, --rate 1,000,000 | 8,145 msg/s | 0.17 | 48 MiB | – | 16,103/s RabbitMQ publish (relayd's properties) | 0.51 | – | none (for information) |",
		"| replay --dry-run, the same 50,000 messages | 47,730 msg/s read | 0.13 | 29 MiB | – | – | – | – | – |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
