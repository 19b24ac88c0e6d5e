package main

import (
	"fmt"
	"math"
	"strings"
)

func (r *Results) addCeiling(c Ceiling) {
	if r.ceilingIndex == nil {
		r.ceilingIndex = map[string]int{}
	}
	if i, ok := r.ceilingIndex[c.Key]; ok {
		// Another sample of the same ceiling: keep the best.
		old := &r.Ceilings[i]
		if len(old.Samples) == 0 {
			old.Samples = []float64{round(old.Rate, 0)}
		}
		old.Samples = append(old.Samples, round(c.Rate, 0))
		if c.Rate > old.Rate {
			old.Messages, old.Seconds, old.Rate, old.CPU = c.Messages, c.Seconds, c.Rate, c.CPU
		}
		return
	}
	r.ceilingIndex[c.Key] = len(r.Ceilings)
	r.Ceilings = append(r.Ceilings, c)
}

func (r *Results) ceiling(key string) (Ceiling, bool) {
	for _, c := range r.Ceilings {
		if c.Key == key {
			return c, true
		}
	}
	return Ceiling{}, false
}

// relayCeiling is the ceiling a burn-down of these targets is set against.
func (r *Results) relayCeiling(targets string) (name string, rate float64) {
	switch targets {
	case "amqp,nats", "amqp":
		if c, ok := r.ceiling(ceilAMQPRelayd); ok {
			return "RabbitMQ publish (relayd's properties)", c.Rate
		}
	case "nats":
		js, ok1 := r.ceiling(ceilJetStream)
		pg, ok2 := r.ceiling(ceilPostgres)
		switch {
		case ok1 && ok2 && js.Rate <= pg.Rate:
			return "min(JetStream, Postgres) = JetStream publish", js.Rate
		case ok1 && ok2:
			return "min(JetStream, Postgres) = Postgres claim+delete", pg.Rate
		}
	}
	return "", 0
}

// boundCeilings are the ceilings whose work a relay of these targets does
// for every message: each costs it at least what it cost the machine there.
// The backfill's lookups and record in Postgres are in no ceiling, and left
// out.
func boundCeilings(targets string) []string {
	switch targets {
	case "nats":
		return []string{ceilJetStream, ceilPostgres}
	case "amqp":
		return []string{ceilAMQPRelayd, ceilPostgres}
	case "amqp,nats":
		return []string{ceilAMQPRelayd, ceilJetStream, ceilPostgres}
	case "backfill":
		return []string{ceilAMQPConsume, ceilJetStream}
	}
	return nil
}

// cpuBound is the most a relay doing the work of these ceilings can move on
// this machine, as a ratio to ceilingRate. Each ceiling took the whole
// machine busy% × cores / rate core-seconds per message, its driver's work
// and its service's together (and anything else running then); relayd does
// the work of each, service and client, for every message, so on all the
// machine's cores it moves at most 1 / Σ (busy% / rate) messages a second.
// The bound is generous: relayd's work beyond the drivers', the cores'
// contention and work in no ceiling are left out, and the machine is taken
// as all busy, which no measurement here has been. A target above it cannot
// be met on this machine, however cheap relayd becomes. 0: a ceiling is
// missing.
func (r *Results) cpuBound(ceilingRate float64, keys []string) float64 {
	if ceilingRate <= 0 || len(keys) == 0 {
		return 0
	}
	perMsg := 0.0 // the machine's share of a second, per message
	for _, k := range keys {
		c, ok := r.ceiling(k)
		if !ok || c.CPU == nil || c.Rate <= 0 || c.CPU.BusyPercent <= 0 {
			return 0
		}
		perMsg += c.CPU.BusyPercent / 100 / c.Rate
	}
	return round(1/(ceilingRate*perMsg), 2)
}

// evaluate sets the ratios to the ceilings and the verdicts.
func (r *Results) evaluate() {
	r.Targets = nil
	peak := 0.0
	for i := range r.Burndown {
		bd := &r.Burndown[i]
		peak = math.Max(peak, bd.PeakRSSMiB)
		if bd.Keys > 0 {
			// Per-key order is set against the same run without keys.
			if u := r.unkeyed(bd.Targets, bd.Instances); u != nil {
				bd.Ceiling, bd.CeilingRate = "the same with null keys", u.RowsPerSecond
				bd.Ratio = round(bd.RowsPerSecond/bd.CeilingRate, 2)
				r.verdict(fmt.Sprintf("burn-down %s ×%d, %s keys: rows/s vs null keys", bd.Targets, bd.Instances, thousands(float64(bd.Keys))), bd.Ratio, ">=", 0.8)
			}
			continue
		}
		bd.Ceiling, bd.CeilingRate = r.relayCeiling(bd.Targets)
		if bd.CeilingRate > 0 {
			bd.Ratio = round(bd.RowsPerSecond/bd.CeilingRate, 2)
			bd.Bound = r.cpuBound(bd.CeilingRate, boundCeilings(bd.Targets))
		}
		// Set against the CPU bound: how much of what this machine's cores
		// allow a relay doing this work; the ratio to the ceiling alone is
		// in the table, for information.
		what := fmt.Sprintf("burn-down %s ×%d: rows/s vs CPU bound", bd.Targets, bd.Instances)
		if bd.Bound > 0 && (bd.Targets == "amqp,nats" || bd.Targets == "nats") {
			r.verdict(what, round(bd.Ratio/bd.Bound, 2), ">=", 0.8)
		}
	}
	if t := r.Tracing; t != nil {
		peak = math.Max(peak, math.Max(t.Off.PeakRSSMiB, t.On.PeakRSSMiB))
		if t.Off.RowsPerSecond > 0 && t.On.RowsPerSecond > 0 {
			r.verdict(tracingTarget(t), t.Ratio, ">=", 0.95)
		}
	}
	if rt := r.Routes; rt != nil {
		peak = math.Max(peak, math.Max(rt.Default.PeakRSSMiB, rt.Routed.PeakRSSMiB))
		if rt.Default.RowsPerSecond > 0 && rt.Routed.RowsPerSecond > 0 {
			r.verdict(routesTarget(rt), rt.Ratio, ">=", 0.95)
		}
	}
	for _, l := range r.Latency {
		peak = math.Max(peak, l.PeakRSSMiB)
		limit := map[int]float64{1000: 25, 5000: 100}[l.Rate]
		if limit == 0 {
			continue
		}
		r.verdict(fmt.Sprintf("latency p99 at %s/s, ms", thousands(float64(l.Rate))), l.P99Ms, "<=", limit)
		if l.LowerBounds {
			// The p99 is only a lower bound: it cannot pass.
			v := &r.Targets[len(r.Targets)-1]
			v.Pass, v.AtLeast = false, true
		}
	}
	if bf := r.Backfill; bf != nil {
		peak = math.Max(peak, bf.PeakRSSMiB)
		if c, ok := r.ceiling(ceilAMQPConsume); ok {
			bf.Ceiling, bf.CeilingRate = "RabbitMQ consume", c.Rate
			bf.Ratio = round(bf.Rate/c.Rate, 2)
			bf.Bound = r.cpuBound(c.Rate, boundCeilings("backfill"))
			if bf.Bound > 0 {
				r.verdict("backfill: msg/s vs CPU bound", round(bf.Ratio/bf.Bound, 2), ">=", 0.8)
			}
		}
	}
	if rp := r.Replay; rp != nil {
		peak = math.Max(peak, rp.PeakRSSMiB)
		if rp.DryRun != nil {
			peak = math.Max(peak, rp.DryRun.PeakRSSMiB)
		}
		// For information: replay has no target of its own.
		if c, ok := r.ceiling(ceilAMQPRelayd); ok {
			rp.Ceiling, rp.CeilingRate = "RabbitMQ publish (relayd's properties)", c.Rate
			rp.Ratio = round(rp.Rate/c.Rate, 2)
		}
	}
	if p := r.Producers; p != nil {
		for _, run := range p.Runs {
			r.verdict(fmt.Sprintf("producers, %d connections: outbox commits/s vs bare", run.Clients), run.Ratio, ">=", 0.9)
			r.verdict(fmt.Sprintf("producers, %d connections, after a waiting relay was killed: outbox commits/s vs bare", run.Clients), run.AfterKillRatio, ">=", 0.9)
		}
		if p.Idle != nil {
			r.verdict("idle relay, commit → both brokers: median, ms", p.Idle.P50Ms, "<=", 5)
		}
	}
	for _, h := range r.Horizon {
		if h.BaselineP99Ms > 0 {
			r.verdict(fmt.Sprintf("%s held: p99 in the hold's last window vs the baseline's", h.Kind), round(h.LastHoldP99Ms/h.BaselineP99Ms, 2), "<=", 1.5)
		}
		r.verdict(fmt.Sprintf("%s held: p99 in the hold's last window, ms", h.Kind), h.LastHoldP99Ms, "<=", 50)
		if h.Kind == "producer transaction" {
			v := r.verdict("the held producer transaction's row: commit → both brokers, ms", h.HeldRowMs, "<=", 1000)
			if h.HeldRowMissing {
				v.Pass = false
			}
		}
	}
	r.PeakRSSMiB = peak
	if peak > 0 {
		r.verdict("relayd peak RSS, MiB (every process of the run)", peak, "<=", 100)
	}
}

// unkeyed is the null-key burn-down run of these targets and instances.
func (r *Results) unkeyed(targets string, instances int) *Burndown {
	for i := range r.Burndown {
		if bd := &r.Burndown[i]; bd.Keys == 0 && bd.Targets == targets && bd.Instances == instances {
			return bd
		}
	}
	return nil
}

func (r *Results) verdict(target string, value float64, op string, limit float64) *Verdict {
	pass := value >= limit
	if op == "<=" {
		pass = value <= limit
	}
	r.Targets = append(r.Targets, Verdict{Target: target, Value: value, Op: op, Limit: limit, Pass: pass})
	return &r.Targets[len(r.Targets)-1]
}

func (r *Results) verdictFor(prefix string) *Verdict {
	for i := range r.Targets {
		if strings.HasPrefix(r.Targets[i].Target, prefix) {
			return &r.Targets[i]
		}
	}
	return nil
}
