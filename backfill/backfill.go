// Package backfill exists for the migration from RabbitMQ to JetStream: it
// drains a legacy RabbitMQ queue into the JetStream stream, losing and
// duplicating nothing, while the relays write to both (relayd backfill).
//
// It follows RabbitMQ Shovel's on-confirm mode, the only mode that loses
// nothing: a delivery is acked on RabbitMQ only after JetStream acked the
// publish (or the message was recorded as already delivered, or parked in a
// dead-letter queue that confirmed it). Anything else is requeued.
//
// Duplicates are kept out three ways: the message id (the AMQP message-id, or
// an id derived from the content) is the Nats-Msg-Id, so JetStream drops a
// repeat inside its duplicate window; ids the relay already delivered to
// JetStream (or still owes it) are acked without being sent, however old;
// and every id moved is recorded in Postgres before its RabbitMQ ack, so a
// rerun after a crash skips it instead of relying on the window.
//
// It is the engine of `relayd backfill`, at the top level by the project's
// layout, not as a library for other programs: its API may change with any
// release.
package backfill

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// Config configures a backfill run.
type Config struct {
	// AMQPURL and Queue name the legacy queue to drain. Required. AMQPURL
	// may list a cluster's nodes, separated by commas (amqpio.SplitURLs):
	// tried in order, and after a connection loss from the next node on.
	AMQPURL string
	Queue   string
	// TLS is used for amqps:// URLs. Default: system roots.
	TLS *tls.Config
	// Prefetch is how many deliveries are unacked at once. Default
	// DefaultPrefetch (4,096).
	Prefetch int
	// NATS is the connection to JetStream; the caller owns it. Required.
	NATS *nats.Conn
	// Stream must receive every message no route of Routes sends to
	// another. Required.
	Stream string
	// Routes, when set, send a message as the relay sends the row its
	// exchange and routing key come from (route.Table.FromAMQP): the route's
	// subject and stream. A message no route explains goes by SubjectPrefix,
	// SubjectMap and Stream.
	Routes *route.Table
	// SubjectPrefix is prepended to the (mapped) routing key.
	SubjectPrefix string
	// SubjectMap rewrites routing-key prefixes before SubjectPrefix is
	// added: {"legacy.orders.": "orders."}. The longest match wins.
	SubjectMap map[string]string
	// DB and Table are the relay's outbox: its record of ids delivered to
	// JetStream, and where moved ids are recorded. Required.
	DB    *pgxpool.Pool
	Table schema.Table
	// DeadLetterQueue receives messages JetStream refuses for good (too
	// large, no stream for the subject, an invalid subject), with the reason
	// in ReasonHeader. Empty: they are held unacked until the run ends and
	// then returned to the queue, and reported.
	DeadLetterQueue string
	// Follow keeps consuming after the queue is drained.
	Follow bool
	// DryRun reports what would happen and changes nothing.
	DryRun bool
	// Limit stops after this many messages (0: no limit).
	Limit int64
	// Rate caps messages per second (0: no cap).
	Rate float64
	// AllowOtherConsumers lets the run start while other consumers are
	// attached to the queue (they would take some of its messages).
	AllowOtherConsumers bool
	// PublishTimeout bounds the wait for a PubAck. Default
	// relay.DefaultPublishTimeout (10s), as relayd passes RELAY_PUBLISH_TIMEOUT
	// to both.
	PublishTimeout time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
	// OnProgress, when set, is called after every batch and at the end.
	OnProgress func(Progress)
	// TracerProvider, when set, traces each message whose traceparent
	// header its sampler keeps: a span from consume to publish, a child of
	// that context, whose traceparent the JetStream copy carries. Default
	// nil: none.
	TracerProvider trace.TracerProvider

	test testOptions
}

// testOptions are zero in production: tests set them, each on its own
// run, to watch it or shorten its waits.
type testOptions struct {
	onFlush      func(inFlight int64) // told, as each batch is handed on, the deliveries not yet settled
	retryInPlace time.Duration        // 0: retryInPlace
}

// DefaultPrefetch is Config.Prefetch's default: enough unacked deliveries
// for every parallel batch to be full, one more filling, and RabbitMQ
// streaming the next ones meanwhile.
const DefaultPrefetch = 4 * parallel * batchMax

// Progress is a snapshot of a run.
type Progress struct {
	QueueDepthAtStart int64
	Summary
}

// Summary is what a run did.
type Summary struct {
	Moved            int64         `json:"moved"`             // published to JetStream and acked
	AlreadyDelivered int64         `json:"already_delivered"` // the relay or an earlier run had it: acked, not re-sent
	Derived          int64         `json:"derived_ids"`       // of the moved, how many had no message-id
	Duplicates       int64         `json:"duplicates"`        // of the moved, how many JetStream already had (a repeat within its duplicate window: dropped, not stored twice)
	DeadLettered     int64         `json:"dead_lettered"`     // refused by JetStream for good, parked in the dead-letter queue
	Failed           int64         `json:"failed"`            // refused for good and held (no dead-letter queue): back in the queue at the end
	Requeued         int64         `json:"requeued"`          // transient failures, requeued to try again
	Duration         time.Duration `json:"-"`
	DurationSeconds  float64       `json:"duration_seconds"` // Duration, in relayd's JSON unit
	Rate             float64       `json:"rate_per_second"`
	DryRun           bool          `json:"dry_run"`
}

// Handled counts messages that reached a final state this run.
func (s Summary) Handled() int64 { return s.Moved + s.AlreadyDelivered + s.DeadLettered + s.Failed }

// ErrOtherConsumers is returned when other consumers share the queue and
// AllowOtherConsumers is not set.
var ErrOtherConsumers = errors.New("other consumers are attached to the queue")

// ErrNotDualWrite is returned when a running relayd instance reports phase
// amqp, or one finished rows lately without JetStream (see
// relay.FinishedWithoutNATS): the backfill needs every instance in dual
// write.
var ErrNotDualWrite = errors.New("the relays are not all in dual write")

// ErrHeldFull is returned when the messages JetStream refuses for good, held
// unacked for want of a dead-letter queue, take the whole prefetch: RabbitMQ
// delivers nothing more, and the run could not finish.
var ErrHeldFull = errors.New("refused messages hold the prefetch")

func (c *Config) applyDefaults() error {
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	c.PublishTimeout = cmp.Or(c.PublishTimeout, relay.DefaultPublishTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.AMQPURL == "" || c.Queue == "":
		return errors.New("backfill: AMQPURL and Queue are required")
	case c.NATS == nil || c.Stream == "":
		return errors.New("backfill: NATS and Stream are required")
	case c.DB == nil:
		return errors.New("backfill: DB is required (the relay's record of delivered ids)")
	case c.Prefetch < 1 || c.Prefetch > 65535:
		return fmt.Errorf("backfill: Prefetch %d out of range 1..65535", c.Prefetch)
	case c.Limit < 0 || c.Rate < 0:
		return errors.New("backfill: Limit and Rate must not be negative")
	}
	if c.Rate > 0 {
		// Deliveries wait unacked behind the limiter: at a low rate a
		// whole prefetch of them is longer than RabbitMQ's consumer
		// timeout (30 min by default), which closes the channel.
		c.Prefetch = min(c.Prefetch, max(1, int(math.Ceil(c.Rate*rateBacklog.Seconds()))))
	}
	return nil
}

// rateBacklog is the most a --rate run takes ahead of its rate.
const rateBacklog = 5 * time.Minute

// Run drains the queue and returns what it did. It stops when the queue is
// empty with nothing in flight (unless Follow), after Limit messages, or when
// ctx is cancelled — then it stops consuming, finishes what is in flight and
// returns the summary with ctx's error.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if err := cfg.applyDefaults(); err != nil {
		return Summary{}, err
	}
	b := &runner{cfg: cfg, log: cfg.Logger, start: time.Now(), seenHeld: map[string]bool{}, retrying: map[string]int{},
		nodes: amqpio.NewNodes(cfg.AMQPURL)}
	if cfg.TracerProvider != nil {
		b.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	if cfg.Rate > 0 {
		b.limiter = rate.NewLimiter(rate.Limit(cfg.Rate), max(1, int(cfg.Rate/10)))
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return Summary{}, err
	}
	b.js = js
	b.pub = jspub.New(cfg.NATS, cfg.Stream, cfg.Prefetch*2, cfg.PublishTimeout)
	if err := b.preflight(ctx); err != nil {
		return Summary{}, err
	}
	if cfg.DryRun {
		return b.dryRun(ctx)
	}
	err = b.loop(ctx)
	return b.summary(), err
}

// runner is one run. It consumes on one RabbitMQ connection at a time
// (consumerConn: open, consume in batches, finish the last deliveries);
// loop reconnects when one is lost. A message that cannot move for now is
// retried in place, unacked; one JetStream refuses for good, without a
// dead-letter queue, is held unacked until its connection ends.
type runner struct {
	cfg     Config
	log     *slog.Logger
	nodes   *amqpio.Nodes       // the consuming connections' (loop reconnects to the next)
	js      jetstream.JetStream // stream lookups
	pub     *jspub.Publisher
	limiter *rate.Limiter
	tracer  trace.Tracer // nil: tracing off
	start   time.Time
	depth0  int64

	// The batches add to these counts as they settle; summary reads them.
	moved, already, derived, dups, dead, failed, requeued atomic.Int64
	lastRequeue                                           atomic.Int64 // unix ns; process stores it at each requeue

	// The batches read and write the fields from mu to lastDupWarn under mu.
	mu       sync.Mutex
	seenHeld map[string]bool // the ids held this run, each counted once
	// retryWait counts in retrying, per message, the attempts that could not
	// move it for now (a full stream, JetStream down); forgetRetries drops it
	// once it is settled for good.
	retrying      map[string]int
	nRetrying     atomic.Int64 // len(retrying), for a check without mu
	lastRetryWarn time.Time
	lastDupWarn   time.Time

	// Only the consume loop (and the preflight before it) reads and writes these.
	lastGhostWarn time.Time // when it last warned that another consumer may hold messages unacked
	dualWriteAt   time.Time // the database's time of the last checkDualWrite that passed
	dualWriteFrom time.Time // the first row that reached JetStream at the first check (zero: none)
	lastDualWrite time.Time // when checkDualWrite was last tried
}

func (b *runner) summary() Summary {
	s := Summary{
		Moved: b.moved.Load(), AlreadyDelivered: b.already.Load(), Derived: b.derived.Load(), Duplicates: b.dups.Load(),
		DeadLettered: b.dead.Load(), Failed: b.failed.Load(), Requeued: b.requeued.Load(),
		Duration: time.Since(b.start), DryRun: b.cfg.DryRun,
	}
	s.DurationSeconds = s.Duration.Seconds()
	if secs := s.Duration.Seconds(); secs > 0 {
		s.Rate = float64(s.Handled()) / secs
	}
	return s
}

func (b *runner) progress() {
	if b.cfg.OnProgress != nil {
		b.cfg.OnProgress(Progress{QueueDepthAtStart: b.depth0, Summary: b.summary()})
	}
}
