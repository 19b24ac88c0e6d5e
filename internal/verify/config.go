package verify

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/schema"
)

// Defaults for the zero values of [Config].
const (
	DefaultWindow      = 24 * time.Hour
	DefaultSlack       = time.Minute
	DefaultExamples    = 10
	DefaultBatchSize   = 10_000
	DefaultIdleTimeout = 5 * time.Second
)

// ErrInvalidConfig is wrapped by the error [Run] returns for a bad [Config].
var ErrInvalidConfig = errors.New("verify: invalid config")

// ErrNoTable is returned by [Run] when the outbox table does not exist.
var ErrNoTable = errors.New("verify: no outbox table")

// Config is what [Run] checks, and against what.
type Config struct {
	// DB is the database of the outbox table. Required. Run holds one of its
	// connections for the whole run (its session temporary tables live
	// there); it never writes to the outbox tables.
	DB *pgxpool.Pool
	// Table is the outbox table; its _owed table (rows a batch left owed
	// to a target) and _delivered table (rows delivered to every target)
	// are read, and its _backfilled table is checked too when it exists.
	// Required.
	Table schema.Table
	// JS reaches the stream. Required.
	JS jetstream.JetStream
	// Stream is the JetStream stream the outbox publishes to. Required.
	Stream string
	// MoreStreams are the other streams it publishes to (those its routes
	// name): the ids are looked for in all of them, and an id in two of
	// them is duplicated.
	MoreStreams []string
	// Since and Until bound the window: rows whose nats_delivered_at (and
	// backfilled ids whose moved_at) is in [Since, Until] are checked.
	// Default Until: now; default Since: Until - 24h.
	Since, Until time.Time
	// Slack widens the stream scan on both sides, [Since-Slack,
	// Until+Slack] by the stream's timestamps, because the clocks of
	// Postgres, the relay and the NATS server differ, and a message is
	// stored a little before its delivery is recorded. Default 1m.
	//
	// The scan also starts one duplicate window (the stream's) earlier: a
	// publish repeated after a crash gets a Duplicate PubAck and is recorded
	// then, up to that window after the message was stored.
	Slack time.Duration
	// Examples is how many examples each finding lists. Default (0): 10;
	// negative: none, counts only.
	Examples int
	// BatchSize is how many (id, sequence) pairs are copied to Postgres at
	// once. Default 10,000.
	BatchSize int
	// IdleTimeout is how long the scan waits for the next message before it
	// asks the server whether anything is left to read. Default 5s.
	IdleTimeout time.Duration
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

func (c *Config) applyDefaults(now time.Time) error {
	switch {
	case c.DB == nil:
		return fmt.Errorf("%w: DB is required", ErrInvalidConfig)
	case c.JS == nil:
		return fmt.Errorf("%w: JS is required", ErrInvalidConfig)
	case c.Stream == "":
		return fmt.Errorf("%w: Stream is required", ErrInvalidConfig)
	case c.Table.Name == "":
		return fmt.Errorf("%w: Table is required", ErrInvalidConfig)
	case c.Slack < 0:
		return fmt.Errorf("%w: Slack %s is negative", ErrInvalidConfig, c.Slack)
	case c.BatchSize < 0:
		return fmt.Errorf("%w: BatchSize %d is negative", ErrInvalidConfig, c.BatchSize)
	}
	if c.Until.IsZero() {
		c.Until = now
	}
	if c.Since.IsZero() {
		c.Since = c.Until.Add(-DefaultWindow)
	}
	if c.Until.Before(c.Since) {
		return fmt.Errorf("%w: until %s is before since %s", ErrInvalidConfig, c.Until.Format(time.RFC3339), c.Since.Format(time.RFC3339))
	}
	if c.Slack == 0 {
		c.Slack = DefaultSlack
	}
	switch {
	case c.Examples == 0:
		c.Examples = DefaultExamples
	case c.Examples < 0:
		c.Examples = 0
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}
