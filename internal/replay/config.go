package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// Publisher is relayd's RabbitMQ sink (amqpsink.Sink), with relay.Sink's
// contract: results[i] nil only when RabbitMQ confirmed msgs[i] unreturned;
// relay.ErrUnavailable or ErrOutOfRoom: try again; any other: refused.
type Publisher interface {
	Publish(ctx context.Context, msgs []*relay.Message, results []error)
}

// Config configures a run.
type Config struct {
	// DB and Table are the outbox: its delivered and backfilled records,
	// the phase history and the run's record. Required.
	DB    *pgxpool.Pool
	Table schema.Table
	// JS and Stream are where the messages are read. Required.
	JS     jetstream.JetStream
	Stream string
	// Routes give each message's topic from its subject, and the exchange
	// and routing key the relay published it to (route.Table.FromSubject);
	// messages on subjects no route gives are counted and skipped. Default:
	// the default route of Exchange and SubjectPrefix.
	Routes        *route.Table
	SubjectPrefix string
	// Sink publishes to the legacy exchange, named Exchange (recorded with
	// the run). Required unless DryRun.
	Sink     Publisher
	Exchange string
	// Request is the window asked for; zero: the latest nats-only period.
	Request Request
	// Restart abandons an unfinished run, or replays sequences a finished
	// run already did.
	Restart bool
	// DryRun counts what a run would send and skip: nothing is published or
	// recorded.
	DryRun bool
	// Rate caps messages published per second. Default DefaultRate.
	Rate float64
	// BatchSize is how many messages are looked up and published at once.
	// Default DefaultBatchSize; with a low Rate, a tenth of a second's worth.
	BatchSize int
	// InFlight is how many batches wait for their confirms at once.
	// Default DefaultInFlight.
	InFlight int
	// PublishTimeout bounds one try of a batch. Default
	// relay.DefaultPublishTimeout.
	PublishTimeout time.Duration
	// Retention is how long the relays keep the delivered record
	// (RELAY_RETENTION): a window starting earlier may have lost its
	// record. Default relay.DefaultRetention.
	Retention time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
	// OnProgress, when set, is called after each batch is recorded and at
	// the end.
	OnProgress func(Progress)
}

// Defaults of Config.
const (
	DefaultRate      = 2000
	DefaultBatchSize = 500
	DefaultInFlight  = 8
)

func (c *Config) applyDefaults() error {
	c.Rate = cmp.Or(c.Rate, DefaultRate)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.InFlight = cmp.Or(c.InFlight, DefaultInFlight)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, relay.DefaultPublishTimeout)
	c.Retention = cmp.Or(c.Retention, relay.DefaultRetention)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.DB == nil:
		return errors.New("replay: DB is required")
	case c.JS == nil || c.Stream == "":
		return errors.New("replay: JS and Stream are required")
	case c.Sink == nil && !c.DryRun:
		return errors.New("replay: Sink is required")
	case !(c.Rate >= 0) || c.BatchSize < 0 || c.InFlight < 0: // !(>=): NaN too
		return fmt.Errorf("replay: Rate, BatchSize and InFlight must not be negative")
	}
	if err := c.Request.check(); err != nil {
		return err
	}
	// A batch is taken from the limiter at once: keep it to a tenth of a
	// second at the rate, so a low rate is not one burst and a long wait.
	// The min in float64: int() of a rate too large for an int is undefined.
	c.BatchSize = max(1, int(min(float64(c.BatchSize), c.Rate/10)))
	return nil
}

// routes are Routes, or the default route.
func (c *Config) routes() *route.Table {
	if c.Routes != nil {
		return c.Routes
	}
	return route.Default(route.Defaults{Exchange: c.Exchange, SubjectPrefix: c.SubjectPrefix, Stream: c.Stream})
}
