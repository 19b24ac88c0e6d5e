// Package cutover decides when consumer groups may read JetStream only, and
// when the relays may stop writing to RabbitMQ (phase nats). Each group is a
// durable JetStream consumer and the legacy queue it replaces, checked by the
// path it moves on: dual read through an inbox, under live traffic, or the
// rolling upgrade, which needs its subjects quiet for an AckWait first.
package cutover

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/schema"
)

// Path is how a consumer group moves off its legacy queue.
type Path string

const (
	// DualRead: the group reads the queue and the stream at once and acts
	// once per message id (an inbox). Live traffic goes on; its queue may
	// keep consumers, which read JetStream too.
	DualRead Path = "dual read"
	// RollingUpgrade: one side processes a message, so the group's queue
	// must be empty and unconsumed and its subjects quiet for the quiet
	// interval (its publishers paused) before it switches.
	RollingUpgrade Path = "rolling upgrade"
)

// Group is one consumer group.
type Group struct {
	// Stream and Consumer: the durable consumer that takes over. Required.
	Stream   string `json:"stream"`
	Consumer string `json:"consumer"`
	// Queue is the legacy queue it replaces. Empty for a group that has
	// moved: its consumer is then checked as a dual-read one, caught up.
	Queue string `json:"queue,omitempty"`
	Path  Path   `json:"path"`
	// Label names the group in the verdict; default its consumer. Two
	// groups with one consumer name, on two streams, need one.
	Label string `json:"label,omitempty"`
}

// switching says whether the group has a switch from its queue ahead, on
// the rolling upgrade: only then are its subjects watched for quiet. A group
// without a queue has moved; what is left to check is that it keeps up.
func (g Group) switching() bool { return g.Path == RollingUpgrade && g.Queue != "" }

// Name is how the verdict names the group: its label, or its consumer.
func (g Group) Name() string {
	if g.Label != "" {
		return g.Label
	}
	return g.Consumer
}

// Config says what to check.
type Config struct {
	// DB and Table: the outbox. Required.
	DB    *pgxpool.Pool
	Table schema.Table
	JS    jetstream.JetStream // required
	// Groups to check, at least one.
	Groups []Group
	// AMQPURL and AMQPTLS reach the legacy queues (TLS for amqps://;
	// default system roots).
	AMQPURL string
	AMQPTLS *tls.Config
	// QuietPeriod overrides a rolling-upgrade group's quiet interval.
	// Default: its consumer's AckWait, or its last BackOff step if longer;
	// with Conservative, AckWait × (MaxAckPending + 1).
	QuietPeriod  time.Duration
	Conservative bool
	// AllConsumers requires every durable consumer of the groups' streams to
	// be a group, or in Exclude: phase 4 checks them all.
	AllConsumers bool
	Exclude      []string
	// Instances are relayd metrics addresses (host:port) that must all
	// report the same version on /version. Optional.
	Instances []string
	// Poll is how often conditions are sampled while watched. Default 500ms.
	Poll time.Duration
	// OnSample, when set, is told each sample while conditions are watched.
	OnSample func(elapsed, total time.Duration)
}

// Condition is one line of the verdict. Group is empty for the conditions
// of the whole outbox.
type Condition struct {
	Group  string `json:"group,omitempty"`
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// skipped: not evaluated, because another condition failed first.
	skipped bool
}

// Result is the verdict: OK only when every condition holds.
type Result struct {
	OK         bool        `json:"ok"`
	Groups     []Group     `json:"groups"`
	Conditions []Condition `json:"conditions"`
	// QuietPeriod is the longest rolling-upgrade group's quiet interval
	// (0 with none).
	QuietPeriod time.Duration `json:"-"`
	// QuietPeriodSeconds is QuietPeriod, in relayd's JSON unit.
	QuietPeriodSeconds float64 `json:"quiet_period_seconds"`
	// checked is the outbox Check checked, and allConsumers whether every
	// consumer of the groups' streams was required: what Clears reads,
	// set by Check only, so that no hand-made Result clears a move.
	checked      schema.Table
	allConsumers bool
}

// Clears implements phase.Clearance: the check passed for table, every
// durable consumer of the groups' streams required (phase nats leaves no
// group unchecked).
func (r Result) Clears(table schema.Table) bool {
	return r.OK && r.allConsumers && r.checked == table
}

// Failed lists the conditions that do not hold, but those not watched
// because another failed first.
func (r Result) Failed() []Condition {
	var out []Condition
	for _, c := range r.Conditions {
		if !c.OK && !c.skipped {
			out = append(out, c)
		}
	}
	return out
}

// The conditions, by name.
const (
	CondOutbox    = "outbox"
	CondPhases    = "relayd phases"
	CondInstances = "relayd versions"
	CondQueue     = "legacy queue"
	CondConsumer  = "jetstream consumer"
	CondQuiet     = "quiescence"
)

// ConfigError is a check that cannot be made as configured: asking again
// will not help. Other errors (Postgres did not answer) may pass.
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

func configError(format string, args ...any) error {
	return &ConfigError{fmt.Sprintf(format, args...)}
}

// LagLimit bounds the outbox lag for JetStream: beyond it the relays are
// not keeping up, and a group's "caught up" means little.
const LagLimit = 30 * time.Second

// Check evaluates every condition, then watches them: each dual-read
// consumer until it has acked what the stream held at the start (up to its
// AckWait), each rolling-upgrade group through its quiet interval. A
// condition that stops holding meanwhile ends the watch.
func Check(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.valid(); err != nil {
		return Result{}, err
	}
	if cfg.Poll == 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	q := &queues{url: cfg.AMQPURL, tls: cfg.AMQPTLS}
	defer q.close()
	w := &watch{cfg: cfg, q: q}
	if err := w.begin(ctx); err != nil {
		return Result{}, err
	}
	// Checked once, and no reason to stop watching the groups: the verdict
	// names every group's state at once.
	once := versions(ctx, cfg.Instances)
	if cfg.AllConsumers {
		once = append(once, namedCondition(ctx, cfg))
	}
	if err := ctx.Err(); err != nil { // its failures above are the cancel's
		return Result{}, err
	}
	if !w.settled() {
		if err := w.run(ctx); err != nil {
			return w.result(once), err
		}
	}
	res := w.result(once)
	res.OK = len(res.Failed()) == 0
	res.checked, res.allConsumers = cfg.Table, cfg.AllConsumers
	return res, nil
}

func (cfg Config) valid() error {
	if cfg.DB == nil || cfg.JS == nil || len(cfg.Groups) == 0 {
		return configError("cutover: DB, JS and a group are required")
	}
	seen, names := map[[2]string]bool{}, map[string]bool{}
	for _, g := range cfg.Groups {
		if g.Stream == "" || g.Consumer == "" {
			return configError("cutover: group %q: a stream and a consumer are required", g.Consumer)
		}
		if g.Path != DualRead && g.Path != RollingUpgrade {
			return configError("cutover: group %s: path %q: want %q or %q", g.Consumer, g.Path, DualRead, RollingUpgrade)
		}
		k := [2]string{g.Stream, g.Consumer}
		if seen[k] {
			return configError("cutover: consumer %s of stream %s is named twice", g.Consumer, g.Stream)
		}
		if names[g.Name()] {
			return configError("cutover: two groups are named %s: label them (STREAM/DURABLE)", g.Name())
		}
		seen[k], names[g.Name()] = true, true
	}
	return nil
}
