package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// writeTable prints the results as markdown.
func writeTable(w io.Writer, r *Results) {
	writeHeader(w, r)
	writeCeilings(w, r)
	writeRelaydRuns(w, r)
	if t := r.Tracing; t != nil {
		writeTracing(w, r, t)
	}
	if rt := r.Routes; rt != nil {
		writeRoutes(w, r, rt)
	}
	writeLatencies(w, r)
	if p := r.Producers; p != nil {
		writeProducers(w, p)
	}
	writeHorizons(w, r)
	writeTargets(w, r)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\nNote: %s\n", n)
	}
}

// writeHeader prints the run: relayd, the machine, the services.
func writeHeader(w io.Writer, r *Results) {
	m := r.Machine
	kind := ""
	if r.Smoke {
		kind = " — SMOKE RUN: sizes too small for the figures to mean anything"
	}
	fmt.Fprintf(w, "\n## relayd-bench%s\n\n", kind)
	fmt.Fprintf(w, "%s; %s, %d cores, %.0f GiB, %s; Postgres %s, RabbitMQ %s, NATS %s; %s messages; wall time %s; load average %s at the start, %s at the end\n\n",
		r.Relayd, m.CPU, m.CPUs, m.MemoryGiB, m.Kernel, m.Postgres, m.RabbitMQ, m.NATS, size(r.PayloadBytes),
		(time.Duration(r.WallSeconds) * time.Second).String(), m.LoadStart, m.LoadEnd)
	if len(r.RelaydEnv) > 0 {
		fmt.Fprintf(w, "**relayd NOT at its defaults:** %s\n\n", strings.Join(r.RelaydEnv, " "))
	}
}

// writeCeilings prints each service's ceiling.
func writeCeilings(w io.Writer, r *Results) {
	if len(r.Ceilings) > 0 {
		fmt.Fprintf(w, "| ceiling (each alone, same run) | rate | messages | machine CPU busy |\n|---|---:|---:|---:|\n")
		for _, c := range r.Ceilings {
			rate := thousands(c.Rate) + "/s"
			if len(c.Samples) > 1 {
				rate += " (best of " + strconv.Itoa(len(c.Samples)) + ")"
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", c.Name, rate, thousands(float64(c.Messages)), busy(c.CPU))
		}
		fmt.Fprintln(w)
	}
}

// writeRelaydRuns prints the burn-downs, the backfill and the replay against
// their ceilings.
func writeRelaydRuns(w io.Writer, r *Results) {
	if len(r.Burndown) > 0 || r.Backfill != nil || r.Replay != nil {
		fmt.Fprintf(w, "| relayd | rate | relayd CPU s / 10k | peak RSS | machine CPU busy | ceiling | ratio | CPU bound | target |\n|---|---:|---:|---:|---:|---|---:|---:|---|\n")
		for _, bd := range r.Burndown {
			rows, verdict := thousands(float64(bd.Rows))+" rows", fmt.Sprintf("burn-down %s ×%d:", bd.Targets, bd.Instances)
			if bd.Keys > 0 {
				rows += " over " + thousands(float64(bd.Keys)) + " keys"
				verdict = fmt.Sprintf("burn-down %s ×%d, %s keys:", bd.Targets, bd.Instances, thousands(float64(bd.Keys)))
			}
			fmt.Fprintf(w, "| burn-down %s, %s, %s | %s rows/s | %.2f | %.0f MiB | %s | %s | %s | %s | %s |\n",
				bd.Targets, rows, instances(bd.Instances), thousands(bd.RowsPerSecond),
				bd.CPUSecondsPer10k, bd.PeakRSSMiB, busy(bd.CPU), ceilingCell(bd.Ceiling, bd.CeilingRate), ratioCell(bd.Ratio),
				ratioCell(bd.Bound), targetCell(r.verdictFor(verdict)))
		}
		if bf := r.Backfill; bf != nil {
			fmt.Fprintf(w, "| backfill, %s messages | %s msg/s | %.2f | %.0f MiB | %s | %s | %s | %s | %s |\n",
				thousands(float64(bf.Messages)), thousands(bf.Rate), bf.CPUSecondsPer10k, bf.PeakRSSMiB, busy(bf.CPU),
				ceilingCell(bf.Ceiling, bf.CeilingRate), ratioCell(bf.Ratio), ratioCell(bf.Bound), targetCell(r.verdictFor("backfill:")))
		}
		if rp := r.Replay; rp != nil {
			fmt.Fprintf(w, "| replay, %s messages the relay put in the stream in the nats-only phase, --rate %s | %s msg/s | %.2f | %.0f MiB | %s | %s | %s | – | none (for information) |\n",
				thousands(float64(rp.Messages)), thousands(float64(rp.RateFlag)), thousands(rp.Rate), rp.CPUSecondsPer10k, rp.PeakRSSMiB, busy(rp.CPU),
				ceilingCell(rp.Ceiling, rp.CeilingRate), ratioCell(rp.Ratio))
			if d := rp.DryRun; d != nil {
				fmt.Fprintf(w, "| replay --dry-run, the same %s messages | %s msg/s read | %.2f | %.0f MiB | – | – | – | – | – |\n",
					thousands(float64(d.Read)), thousands(d.Rate), d.CPUSecondsPer10k, d.PeakRSSMiB)
			}
		}
		fmt.Fprintln(w)
	}
}

// writeLatencies prints the open-loop latency runs.
func writeLatencies(w io.Writer, r *Results) {
	if len(r.Latency) > 0 {
		fmt.Fprintf(w, "| latency, commit → both brokers (open loop, %s, 1 relayd) | p50 | p90 | p99 | max | messages | producers on schedule | target |\n|---|---:|---:|---:|---:|---:|---|---|\n", r.Latency[0].Targets)
		for _, l := range r.Latency {
			sched := fmt.Sprintf("yes (max %.0f ms late)", l.MaxLateMs)
			if l.FellBehind {
				sched = fmt.Sprintf("**no**: %s commits > %s late, max %s ms, %s rows/s achieved", thousands(float64(l.LateStarts)), lateThreshold, thousands(l.MaxLateMs), thousands(l.AchievedRate))
			}
			msgs := thousands(float64(l.Received))
			lat := ms
			if l.Missing > 0 {
				msgs += fmt.Sprintf(" (**%s not yet arrived when the wait ended**: the latencies are lower bounds)", thousands(float64(l.Missing)))
				lat = func(v float64) string { return "≥ " + ms(v) }
			}
			perCommit := fmt.Sprintf("%d rows", l.RowsPerCommit)
			if l.RowsPerCommit == 1 {
				perCommit = "1 row"
			}
			fmt.Fprintf(w, "| %s rows/s (%s commits/s × %s) for %.0f s after %.0f s warm-up | %s | %s | %s | %s | %s | %s | %s |\n",
				thousands(float64(l.Rate)), thousands(l.CommitsPerSecond), perCommit, l.MeasuredSeconds, l.WarmupSeconds, lat(l.P50Ms), lat(l.P90Ms), lat(l.P99Ms), lat(l.MaxMs),
				msgs, sched, targetCell(r.verdictFor(fmt.Sprintf("latency p99 at %s/s", thousands(float64(l.Rate))))))
		}
		fmt.Fprintln(w)
	}
}

// writeTargets prints each target's verdict.
func writeTargets(w io.Writer, r *Results) {
	if len(r.Targets) > 0 {
		pass := 0
		fmt.Fprintf(w, "| target | measured | |\n|---|---:|---|\n")
		for _, v := range r.Targets {
			verdict := "FAIL"
			switch {
			case v.Pass:
				verdict, pass = "PASS", pass+1
			}
			op := map[string]string{">=": "≥", "<=": "≤"}[v.Op]
			value := strconv.FormatFloat(round(v.Value, 2), 'f', -1, 64)
			if v.AtLeast {
				value = "≥ " + value
			}
			fmt.Fprintf(w, "| %s %s %s | %s | %s |\n", v.Target, op, strconv.FormatFloat(v.Limit, 'f', -1, 64), value, verdict)
		}
		fmt.Fprintf(w, "\n%d of %d targets met", pass, len(r.Targets))
		fmt.Fprintln(w, ".")
	}
}

func busy(c *CPUSplit) string {
	if c == nil {
		return "–"
	}
	return strconv.FormatFloat(c.BusyPercent, 'f', 0, 64) + " %"
}

func instances(n int) string {
	if n == 1 {
		return "1 instance"
	}
	return strconv.Itoa(n) + " instances"
}

func ceilingCell(name string, rate float64) string {
	if rate == 0 {
		return "–"
	}
	return fmt.Sprintf("%s/s %s", thousands(rate), name)
}

func ratioCell(r float64) string {
	if r == 0 {
		return "–"
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}

func targetCell(v *Verdict) string {
	if v == nil {
		return "–"
	}
	op := map[string]string{">=": "≥", "<=": "≤"}[v.Op]
	res := "FAIL"
	if v.Pass {
		res = "PASS"
	}
	unit, value := "", ""
	if strings.Contains(v.Target, ", ms") {
		unit = " ms"
	}
	if strings.HasSuffix(v.Target, "vs CPU bound") {
		value = strconv.FormatFloat(v.Value, 'f', 2, 64) + " of the bound, "
	}
	return fmt.Sprintf("%s%s %s%s **%s**", value, op, strconv.FormatFloat(v.Limit, 'f', -1, 64), unit, res)
}

func ms(v float64) string {
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 1, 64) + " ms"
	}
	return thousands(v) + " ms"
}

func size(n int) string {
	if n%1024 == 0 {
		return strconv.Itoa(n/1024) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}

// thousands formats a rate or count rounded to an integer, with commas.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func round(v float64, places int) float64 {
	p := math.Pow10(places)
	return math.Round(v*p) / p
}

func mib(bytes int64) float64 { return round(float64(bytes)/(1<<20), 1) }

func per10k(cpu time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return round(cpu.Seconds()/(float64(n)/10000), 3)
}

// measured sets the ceiling's figures from n messages in elapsed.
func (c *Ceiling) measured(n int, elapsed time.Duration) {
	c.Messages, c.Seconds, c.Rate = n, round(elapsed.Seconds(), 3), round(float64(n)/elapsed.Seconds(), 0)
}

// writeProducers prints what relayd costs the producers.
func writeProducers(w io.Writer, p *Producers) {
	fmt.Fprintf(w, "| producers: single-row commits/s, no relay draining (medians of %d rounds, tables taking turns) | bare table | outbox | ratio | after a waiting relayd was SIGKILLed: bare | outbox | ratio |\n|---|---:|---:|---:|---:|---:|---:|\n", producerRounds)
	for _, run := range p.Runs {
		fmt.Fprintf(w, "| %d connections | %s/s | %s/s | %s | %s/s | %s/s | %s |\n", run.Clients,
			thousands(run.Bare), thousands(run.Outbox), ratioCell(run.Ratio), thousands(run.BareAfterKill), thousands(run.AfterKill), ratioCell(run.AfterKillRatio))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| producers: commit latency at %s commits/s, relayd relaying | p50 | p99 |\n|---|---:|---:|\n", thousands(float64(p.OutboxLatency.CommitsPerSecond)))
	fmt.Fprintf(w, "| bare table | %s | %s |\n| outbox | %s | %s |\n", ms(p.BareLatency.P50Ms), ms(p.BareLatency.P99Ms), ms(p.OutboxLatency.P50Ms), ms(p.OutboxLatency.P99Ms))
	if p.Idle != nil {
		fmt.Fprintf(w, "\nIdle relayd, commit → both brokers, %d rows one at a time: median %s, max %s.\n", p.Idle.Rows, ms(p.Idle.P50Ms), ms(p.Idle.MaxMs))
	}
	fmt.Fprintln(w)
}
