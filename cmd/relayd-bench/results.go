package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Results is everything one run measured; it is written as JSON as is.
type Results struct {
	Schema       int        `json:"schema_version"`
	StartedAt    time.Time  `json:"started_at"`
	WallSeconds  float64    `json:"wall_seconds"`
	Smoke        bool       `json:"smoke"`
	PayloadBytes int        `json:"payload_bytes"`
	Relayd       string     `json:"relayd"`
	RelaydEnv    []string   `json:"relayd_env,omitempty"` // settings other than relayd's defaults
	Machine      Machine    `json:"machine"`
	Ceilings     []Ceiling  `json:"ceilings"`
	Burndown     []Burndown `json:"burndown"`
	Tracing      *Tracing   `json:"tracing,omitempty"`
	Latency      []Latency  `json:"latency"`
	Backfill     *Backfill  `json:"backfill,omitempty"`
	Producers    *Producers `json:"producers,omitempty"`
	PeakRSSMiB   float64    `json:"relayd_peak_rss_mib"` // highest of every relayd process
	Targets      []Verdict  `json:"targets"`
	Notes        []string   `json:"notes,omitempty"`
	ceilingIndex map[string]int
}

// Machine is where the run happened.
type Machine struct {
	CPU       string  `json:"cpu"`
	CPUs      int     `json:"cpus"`
	MemoryGiB float64 `json:"memory_gib"`
	Kernel    string  `json:"kernel"`
	GoVersion string  `json:"go"`
	Postgres  string  `json:"postgres"`
	RabbitMQ  string  `json:"rabbitmq"`
	NATS      string  `json:"nats"`
	// The 1, 5 and 15 minute load averages when the run started and ended:
	// anything else running on the machine shows here.
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
}

// Ceiling keys.
const (
	ceilJetStream   = "jetstream_publish"
	ceilAMQPRelayd  = "rabbitmq_publish_relayd_properties"
	ceilAMQPPlain   = "rabbitmq_publish_plain"
	ceilPostgres    = "postgres_claim_delete"
	ceilAMQPConsume = "rabbitmq_consume"
	// The producers' side, for information: single-row commits into the
	// outbox with its insert trigger, and with the trigger disabled.
	ceilCommitNotify = "postgres_commit_notify"
	ceilCommitPlain  = "postgres_commit_no_trigger"
)

// Ceiling is what one service does alone, driven as hard as relayd drives it.
type Ceiling struct {
	Key      string  `json:"key"`
	Name     string  `json:"name"`
	Messages int     `json:"messages"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"per_second"`
	// Samples holds every measurement when there were several; Rate is the
	// best of them.
	Samples []float64 `json:"samples_per_second,omitempty"`
	// CPU is where the machine's CPU went (of the best sample).
	CPU *CPUSplit `json:"cpu_core_seconds_per_10k,omitempty"`
}

// Burndown is one relay burn-down run.
type Burndown struct {
	Targets   string `json:"targets"`
	Instances int    `json:"instances"`
	Rows      int    `json:"rows"`
	// Keys is the number of distinct keys the rows take turns in (per-key
	// order applies); 0 means every row has a null key.
	Keys             int     `json:"keys,omitempty"`
	Seconds          float64 `json:"seconds"`
	RowsPerSecond    float64 `json:"rows_per_second"`
	CPUSecondsPer10k float64 `json:"cpu_seconds_per_10k_rows"`
	PeakRSSMiB       float64 `json:"peak_rss_mib"` // highest of the instances
	Ceiling          string  `json:"ceiling,omitempty"`
	CeilingRate      float64 `json:"ceiling_per_second,omitempty"`
	Ratio            float64 `json:"ratio,omitempty"`
	// Bound is the most Ratio this machine's CPU allows (see cpuBound).
	Bound float64 `json:"cpu_bound_ratio,omitempty"`
	// CPU is where the machine's CPU went from relayd's start to the last
	// row done.
	CPU *CPUSplit `json:"cpu_core_seconds_per_10k,omitempty"`
}

// Latency is one open-loop latency run.
type Latency struct {
	Rate             int     `json:"rate_per_second"` // rows
	RowsPerCommit    int     `json:"rows_per_commit"`
	CommitsPerSecond float64 `json:"commits_per_second"`
	Targets          string  `json:"targets"`
	Producers        int     `json:"producers"`
	WarmupSeconds    float64 `json:"warmup_seconds"`
	MeasuredSeconds  float64 `json:"measured_seconds"`
	Committed        int     `json:"committed"` // commits scheduled in the measured window
	Received         int     `json:"received"`  // of those, received from both brokers
	Missing          int     `json:"missing"`   // not received from both within the grace period
	// LowerBounds: some messages had not arrived when the wait ended
	// (Missing; the relay fell behind the rate). They count with the time
	// they waited, so the true latencies are at least the figures.
	LowerBounds bool    `json:"lower_bounds"`
	P50Ms       float64 `json:"p50_ms"`
	P90Ms       float64 `json:"p90_ms"`
	P99Ms       float64 `json:"p99_ms"`
	MaxMs       float64 `json:"max_ms"`
	// Each broker on its own (commit → received from it): which one makes
	// the tail.
	NATSP99Ms float64 `json:"nats_p99_ms"`
	AMQPP99Ms float64 `json:"amqp_p99_ms"`
	// The producers' timetable: how late commits started, and the rate
	// they achieved over the measured window.
	AchievedRate float64 `json:"achieved_rate_per_second"`
	LateStarts   int     `json:"late_commits"` // commits that started more than lateThreshold after their slot
	P99LateMs    float64 `json:"p99_late_ms"`
	MaxLateMs    float64 `json:"max_late_ms"`
	FellBehind   bool    `json:"fell_behind"`
	// The relayd process.
	CPUSecondsPer10k float64 `json:"cpu_seconds_per_10k_rows"`
	PeakRSSMiB       float64 `json:"peak_rss_mib"`
	// CPU is where the machine's CPU went during the producing.
	CPU *CPUSplit `json:"cpu_core_seconds_per_10k,omitempty"`
}

// lateThreshold is how late a commit may start before it counts as late.
const lateThreshold = 10 * time.Millisecond

// Backfill is the `relayd backfill` run.
type Backfill struct {
	Messages         int       `json:"messages"`
	Moved            int64     `json:"moved"`
	Seconds          float64   `json:"seconds"`             // process start to exit
	Rate             float64   `json:"per_second"`          // moved / seconds
	ReportedRate     float64   `json:"reported_per_second"` // the backfill's own summary
	CPUSecondsPer10k float64   `json:"cpu_seconds_per_10k_messages"`
	PeakRSSMiB       float64   `json:"peak_rss_mib"`
	Ceiling          string    `json:"ceiling,omitempty"`
	CeilingRate      float64   `json:"ceiling_per_second,omitempty"`
	Ratio            float64   `json:"ratio,omitempty"`
	Bound            float64   `json:"cpu_bound_ratio,omitempty"` // see cpuBound
	CPU              *CPUSplit `json:"cpu_core_seconds_per_10k,omitempty"`
}

// Producers is what relayd costs the services that write the outbox.
type Producers struct {
	Runs []ProducerRun `json:"runs"`
	// The producers' commit latency at a steady rate while relayd relays
	// the outbox, and into the bare table.
	BareLatency   CommitLatency `json:"bare_commit_latency"`
	OutboxLatency CommitLatency `json:"outbox_commit_latency"`
	Idle          *IdleLatency  `json:"idle_relay_latency,omitempty"`
}

// ProducerRun is single-row commits/s from Clients connections, each the
// best of producerRounds runs, the tables taking turns; no relay drains the
// outbox.
type ProducerRun struct {
	Clients int     `json:"clients"`
	Bare    float64 `json:"bare_commits_per_second"`
	Outbox  float64 `json:"outbox_commits_per_second"`
	// AfterKill: the outbox after a relayd that waited for rows was
	// SIGKILLed.
	AfterKill      float64 `json:"outbox_after_killed_relay_commits_per_second"`
	Ratio          float64 `json:"ratio"`
	AfterKillRatio float64 `json:"after_killed_relay_ratio"`
}

// CommitLatency is the latency of single-row commits on a fixed timetable.
type CommitLatency struct {
	CommitsPerSecond int     `json:"commits_per_second"`
	P50Ms            float64 `json:"p50_ms"`
	P99Ms            float64 `json:"p99_ms"`
}

// IdleLatency is commit → both brokers for rows written one at a time to
// an idle relay.
type IdleLatency struct {
	Rows  int     `json:"rows"`
	P50Ms float64 `json:"p50_ms"`
	MaxMs float64 `json:"max_ms"`
}

// Verdict is one target and whether the run met it.
type Verdict struct {
	Target string  `json:"target"`
	Value  float64 `json:"value"`
	Op     string  `json:"op"` // ">=" or "<="
	Limit  float64 `json:"limit"`
	Pass   bool    `json:"pass"`
	// AtLeast: Value is a lower bound (see Latency.LowerBounds).
	AtLeast bool `json:"at_least,omitempty"`
}

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
	if p := r.Producers; p != nil {
		for _, run := range p.Runs {
			r.verdict(fmt.Sprintf("producers, %d connections: outbox commits/s vs bare", run.Clients), run.Ratio, ">=", 0.9)
			r.verdict(fmt.Sprintf("producers, %d connections, after a waiting relay was killed: outbox commits/s vs bare", run.Clients), run.AfterKillRatio, ">=", 0.9)
		}
		if p.Idle != nil {
			r.verdict("idle relay, commit → both brokers: median, ms", p.Idle.P50Ms, "<=", 5)
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

// writeTable prints the results as markdown.
func writeTable(w io.Writer, r *Results) {
	writeHeader(w, r)
	writeCeilings(w, r)
	writeRelaydRuns(w, r)
	if t := r.Tracing; t != nil {
		writeTracing(w, r, t)
	}
	writeLatencies(w, r)
	if p := r.Producers; p != nil {
		writeProducers(w, p)
	}
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

// writeRelaydRuns prints the burn-downs and the backfill against their ceilings.
func writeRelaydRuns(w io.Writer, r *Results) {
	if len(r.Burndown) > 0 || r.Backfill != nil {
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
	fmt.Fprintf(w, "| producers: single-row commits/s, no relay draining | bare table | outbox | ratio | outbox after a waiting relayd was SIGKILLed | ratio |\n|---|---:|---:|---:|---:|---:|\n")
	for _, run := range p.Runs {
		fmt.Fprintf(w, "| %d connections (best of %d, tables taking turns) | %s/s | %s/s | %s | %s/s | %s |\n", run.Clients, producerRounds,
			thousands(run.Bare), thousands(run.Outbox), ratioCell(run.Ratio), thousands(run.AfterKill), ratioCell(run.AfterKillRatio))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| producers: commit latency at %s commits/s, relayd relaying | p50 | p99 |\n|---|---:|---:|\n", thousands(float64(p.OutboxLatency.CommitsPerSecond)))
	fmt.Fprintf(w, "| bare table | %s | %s |\n| outbox | %s | %s |\n", ms(p.BareLatency.P50Ms), ms(p.BareLatency.P99Ms), ms(p.OutboxLatency.P50Ms), ms(p.OutboxLatency.P99Ms))
	if p.Idle != nil {
		fmt.Fprintf(w, "\nIdle relayd, commit → both brokers, %d rows one at a time: median %s, max %s.\n", p.Idle.Rows, ms(p.Idle.P50Ms), ms(p.Idle.MaxMs))
	}
	fmt.Fprintln(w)
}
