package main

import "time"

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
	Routes       *Routes    `json:"routes,omitempty"`
	Latency      []Latency  `json:"latency"`
	Backfill     *Backfill  `json:"backfill,omitempty"`
	Replay       *Replay    `json:"replay,omitempty"`
	Producers    *Producers `json:"producers,omitempty"`
	Horizon      []Horizon  `json:"horizon,omitempty"`
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
	// outbox with its wake-up, and with a plain created_at default.
	ceilCommitNotify = "postgres_commit_notify"
	ceilCommitPlain  = "postgres_commit_no_wakeup"
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

// Replay is the `relayd replay` run, and its dry run before it.
type Replay struct {
	Messages int    `json:"messages"`
	Source   string `json:"source"`    // how the stream got them
	RateFlag int    `json:"rate_flag"` // --rate
	Sent     int64  `json:"sent"`      // the replay's summary
	Received int    `json:"received"`  // message ids the legacy queue got, each once
	// Seconds and Rate are the replay's own summary's (messages read per
	// second); ProcessSeconds is from process start to exit.
	Seconds          float64       `json:"seconds"`
	Rate             float64       `json:"per_second"`
	ProcessSeconds   float64       `json:"process_seconds"`
	CPUSecondsPer10k float64       `json:"cpu_seconds_per_10k_messages"`
	PeakRSSMiB       float64       `json:"peak_rss_mib"`
	Ceiling          string        `json:"ceiling,omitempty"` // for information: no target
	CeilingRate      float64       `json:"ceiling_per_second,omitempty"`
	Ratio            float64       `json:"ratio,omitempty"`
	CPU              *CPUSplit     `json:"cpu_core_seconds_per_10k,omitempty"`
	DryRun           *ReplayDryRun `json:"dry_run,omitempty"`
}

// ReplayDryRun is `relayd replay --dry-run` over the same window: it reads
// the stream and looks the ids up, and publishes nothing.
type ReplayDryRun struct {
	Read             int64   `json:"read"`
	WouldSend        int64   `json:"would_send"`
	Seconds          float64 `json:"seconds"`
	Rate             float64 `json:"per_second"` // its summary's
	CPUSecondsPer10k float64 `json:"cpu_seconds_per_10k_messages"`
	PeakRSSMiB       float64 `json:"peak_rss_mib"`
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

// ProducerRun is single-row commits/s from Clients connections, the median
// of producerRounds runs, the tables taking turns, and the median of the
// rounds' ratios; no relay drains the outbox.
type ProducerRun struct {
	Clients int     `json:"clients"`
	Bare    float64 `json:"bare_commits_per_second"`
	Outbox  float64 `json:"outbox_commits_per_second"`
	Ratio   float64 `json:"ratio"`
	// AfterKill: the outbox after a relayd that waited for rows was
	// SIGKILLed, against the bare table measured beside it.
	BareAfterKill  float64 `json:"bare_after_killed_relay_commits_per_second"`
	AfterKill      float64 `json:"outbox_after_killed_relay_commits_per_second"`
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
