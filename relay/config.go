package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/schema"
)

// Config configures a Relay. Zero values take the defaults stated.
type Config struct {
	// Table is the outbox table. Default "outbox".
	Table schema.Table
	// Sinks are the targets the relay can publish to, at most one per
	// Target. Required.
	Sinks []Sink
	// Routes chooses each row's exchange, routing key, subject and stream;
	// a row left owed to a target keeps the route it first went by, which
	// the owed table records. Default nil: each sink's defaults.
	Routes *route.Table
	// Targets is the phase the relay starts in: the targets a row must
	// reach. Each needs a sink. Default: the sinks' targets.
	Targets []Target
	// Phase, when set, is the table's shared phase, read every
	// PhaseInterval (first before any claim): the relay switches to it
	// unless Pinned, and reports it (Observer.Phase). Default nil: the
	// relay runs Targets.
	Phase PhaseSource
	// Pinned keeps the relay in Targets whatever Phase says; it logs and
	// reports the difference. Default false.
	Pinned bool
	// PhaseInterval is how often Phase is read. Default 2s.
	PhaseInterval time.Duration
	// BatchSize is how many rows one worker claims at a time, 2 to 10,000
	// (at most half of them keyed). Default 500.
	BatchSize int
	// Workers is how many batches are in flight at once. Default 8.
	Workers int
	// PublishTimeout bounds how long a batch waits for confirms; messages
	// without one by then are retried. Default 10s.
	PublishTimeout time.Duration
	// PollInterval is how often an idle worker looks for rows when no
	// NOTIFY arrives. Default 1s.
	PollInterval time.Duration
	// RetryMin and RetryMax bound the per-row backoff after a failed
	// publish (exponential with jitter). Defaults 1s and 5m.
	RetryMin, RetryMax time.Duration
	// MaxAttempts parks a row for a target after this many failed
	// attempts (failures of the broker itself — disconnects, timeouts — do
	// not count). Negative means never. Default (0) 20: about an hour of
	// retries with the default backoff.
	MaxAttempts int
	// SkipParkedKeys lets the later rows of a key go past a parked row of
	// that key. Default false: a parked row holds its key (strict order)
	// until an operator retries it.
	SkipParkedKeys bool
	// Retention is how long the record of delivered message ids (which
	// reached each broker, and when) is kept; delivered rows themselves
	// leave the outbox at once. Default 24h.
	Retention time.Duration
	// CleanupInterval is how often delivered ids past Retention are
	// deleted, in batches of 1000, and — in the nats-only phase — the
	// next slice of the outbox is swept for rows JetStream has that
	// RabbitMQ owed before the move to nats only. Default 1m.
	CleanupInterval time.Duration
	// Logger receives the relay's logs. Default: discard.
	Logger *slog.Logger
	// Metrics receives the relay's measurements. Default: none.
	Metrics Observer
	// TracerProvider, when set, traces each row whose traceparent header
	// the provider's sampler keeps: a span per target publish, its
	// traceparent in the headers that target gets (see trace.go). Default
	// nil: no spans, and no row's headers are read for them.
	TracerProvider trace.TracerProvider
}

// Defaults of Config's zero values. cmd/relayd's env tags repeat them (a
// tag cannot name a constant); a test there holds the two equal.
const (
	DefaultBatchSize       = 500
	DefaultWorkers         = 8
	DefaultPublishTimeout  = 10 * time.Second
	DefaultPollInterval    = time.Second
	DefaultRetryMin        = time.Second
	DefaultRetryMax        = 5 * time.Minute
	DefaultMaxAttempts     = 20
	DefaultRetention       = 24 * time.Hour
	DefaultCleanupInterval = time.Minute
	DefaultPhaseInterval   = 2 * time.Second
)

func (c *Config) applyDefaults() {
	if c.Table == (schema.Table{}) {
		c.Table = schema.Table{Name: schema.DefaultTable}
	}
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.RetryMin = cmp.Or(c.RetryMin, DefaultRetryMin)
	c.RetryMax = cmp.Or(c.RetryMax, DefaultRetryMax)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, DefaultCleanupInterval)
	c.PhaseInterval = cmp.Or(c.PhaseInterval, DefaultPhaseInterval)
	if len(c.Targets) == 0 {
		for _, s := range c.Sinks {
			if s != nil {
				c.Targets = append(c.Targets, s.Target())
			}
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = nopObserver{}
	}
}

func (c *Config) validate() error {
	if _, err := schema.ParseTable(c.Table.String()); err != nil {
		return err
	}
	if len(c.Sinks) == 0 {
		return errors.New("relay: no sinks: at least one target must be enabled")
	}
	seen := map[Target]bool{}
	for _, s := range c.Sinks {
		if s == nil {
			return errors.New("relay: nil sink")
		}
		if seen[s.Target()] {
			return fmt.Errorf("relay: two sinks for target %s", s.Target())
		}
		if !knownTarget(s.Target()) {
			return fmt.Errorf("relay: unknown target %q", s.Target())
		}
		seen[s.Target()] = true
	}
	for _, t := range c.Targets {
		if !seen[t] {
			return fmt.Errorf("relay: target %s has no sink", t)
		}
	}
	switch {
	case c.BatchSize < 2 || c.BatchSize > 10000:
		// At least 2: a batch takes at most half (and at least 1) keyed
		// rows, and with 1 a keyed row would leave no room for unkeyed ones.
		return fmt.Errorf("relay: BatchSize %d out of range 2..10000", c.BatchSize)
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("relay: Workers %d out of range 1..256", c.Workers)
	case c.PublishTimeout < 0, c.PollInterval < 0, c.RetryMin < 0, c.Retention < 0, c.CleanupInterval < 0, c.PhaseInterval < 0:
		return errors.New("relay: durations must not be negative")
	case c.RetryMax < c.RetryMin:
		return fmt.Errorf("relay: RetryMax %v below RetryMin %v", c.RetryMax, c.RetryMin)
	}
	return nil
}
