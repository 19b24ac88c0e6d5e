// Package inbox lets a consumer act once per message id while it reads both
// brokers during the migration from RabbitMQ to NATS JetStream.
//
// relayd publishes every outbox row to both brokers with the same message id
// (the AMQP message-id property, the Nats-Msg-Id header), and RabbitMQ itself
// never dedupes: a consumer that reads the legacy queue and the JetStream
// consumer at the same time sees each message at least twice, and more after
// a redelivery or a relay crash. An [Inbox] is a Postgres table of the ids a
// consumer group has processed. [Inbox.Process] checks and sets the id, runs
// the handler and commits, all in one transaction, so the record of the id and
// the handler's own writes commit together or not at all:
//
//	check and set the message id → perform the task → commit → acknowledge
//
// A message whose id is already recorded is acknowledged without running the
// handler. Two deliveries of the same id processed at the same moment (one
// from each broker, the usual case) are serialised by the table's primary key:
// the second insert waits for the first transaction and then sees the
// conflict, or proceeds if the first rolled back. The broker is acknowledged
// only after the commit, so a consumer that dies in between gets the message
// again and the inbox suppresses it.
//
// [Inbox.HandleAMQP] and [Inbox.HandleJetStream] wrap Process with the
// acknowledgement policy for each broker. The table is created by [Migrate]
// (or [NewProvider]); rows older than [Config.Retention] are deleted by
// [Inbox.Cleanup] / [Inbox.RunCleanup].
//
// The guarantee covers what the handler writes through the transaction it is
// given. Side effects outside Postgres (an e-mail, an HTTP call) can still
// happen twice if the commit fails after them; make those idempotent.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/msgid"
	"github.com/relayd/relayd/internal/uuidtext"
	"github.com/relayd/relayd/schema"
)

// Message sources, the values of [Message.Source].
const (
	SourceAMQP = "amqp"
	SourceNATS = "nats"
)

// DerivedIDHeader carries a message id the backfill derived for a legacy
// message that had no AMQP message-id. The adapters use it when the broker's
// own id is missing.
const DerivedIDHeader = msgid.DerivedIDHeader

// Defaults for [Config].
const (
	DefaultTable     = "inbox"
	DefaultConsumer  = "default"
	DefaultRetention = 7 * 24 * time.Hour
	DefaultRetryMin  = time.Second
	DefaultRetryMax  = time.Minute
)

// MaxIDLength is the longest message id accepted, in bytes; a longer one is
// treated like a missing id. (An AMQP message-id is at most 255 bytes.)
const MaxIDLength = 1024

// maxConsumerLength bounds Config.Consumer, which shares the primary key's
// index entry with the message id.
const maxConsumerLength = 200

var (
	// ErrNoMessageID means a message carries no id: neither the broker's
	// (AMQP message-id, Nats-Msg-Id) nor [DerivedIDHeader]. It cannot be
	// deduplicated, and retrying cannot fix it: the adapters reject it
	// without requeueing.
	ErrNoMessageID = errors.New("inbox: message has no id")
	// ErrInvalidMessageID means a message id cannot be stored: longer than
	// [MaxIDLength], not UTF-8, or containing a NUL byte. The adapters
	// treat it like [ErrNoMessageID].
	ErrInvalidMessageID = errors.New("inbox: invalid message id")
)

// Message is one delivery, from either broker, as the handler sees it.
type Message struct {
	// ID is the message id: the AMQP message-id or Nats-Msg-Id, else
	// [DerivedIDHeader], else (AMQP) the id derived from the content. Ids
	// are compared exactly, except that an id in UUID text form is
	// lower-cased first (relayd writes canonical lower-case UUIDs; another
	// producer may upper-case them).
	ID string
	// Source is where the message came from: [SourceAMQP] or [SourceNATS].
	Source string
	// Subject is the AMQP routing key or the NATS subject.
	Subject string
	// Headers are the message's headers. AMQP header values that are not
	// strings are formatted with fmt.Sprint; of a NATS header with several
	// values, the first.
	Headers map[string]string
	// Payload is the message body.
	Payload []byte
}

// Handler performs the task for one message. tx is the transaction in which
// the message id was recorded: write through it, and the writes commit with
// the id or not at all. A Handler must not commit or roll back tx (it may use
// savepoints). Returning an error rolls everything back, the id included, so
// the message is processed again when the broker redelivers it.
//
// While the handler runs, a delivery of the same id from the other broker
// waits for this transaction: keep handlers short.
type Handler func(ctx context.Context, tx pgx.Tx, m Message) error

// Config configures an [Inbox]. The zero value is usable.
type Config struct {
	// Table is the inbox table, "name" or "schema.name" (lower-case
	// identifiers; see [schema.ParseTable]), created by [Migrate].
	// Default: "inbox" (on the search_path).
	Table string
	// Consumer names the consumer group this Inbox processes messages for.
	// It is part of the key, so several groups can share one table and
	// each processes every message once. Every instance of one group must
	// use the same name. At most 200 bytes of UTF-8. Default: "default".
	Consumer string
	// Retention is how long a processed id is remembered: a message
	// redelivered or arriving from the other broker later than this is
	// processed again. It must cover the longest gap between two copies of
	// a message: one broker lagging behind the other (an outage, a relay
	// catching up), redeliveries, and a backfill that replays old messages.
	// Default: 7 days.
	Retention time.Duration
	// RetryMin and RetryMax bound the delay before JetStream redelivers a
	// message whose handler failed: RetryMin·2^(deliveries-1), at most
	// RetryMax. RabbitMQ has no delayed requeue: a failed AMQP message is
	// requeued at once (bound redeliveries with a dead-letter exchange and
	// a delivery limit). Defaults: 1s and 1m.
	RetryMin, RetryMax time.Duration
	// DeriveAMQPID gives the id of an AMQP delivery that has neither a
	// message-id nor [DerivedIDHeader] (a legacy producer's message).
	// Default: the derivation `relayd backfill` uses ([AMQPMessage];
	// docs/message-ids.md), so such a message read from the legacy queue and
	// its backfilled JetStream copy share one id. Two such messages identical
	// in everything the id is made of (routing key, timestamp, headers,
	// body, ...) are one message: the second is acked as a duplicate,
	// unhandled. A function returning "" makes such deliveries poison
	// (rejected with [ErrNoMessageID]). It is HandleAMQP's: AMQPMessage
	// always derives with the default.
	DeriveAMQPID func(amqp.Delivery) string
	// Logger receives RunCleanup's errors. Default: nil, logs are
	// discarded.
	Logger *slog.Logger
	// Registerer, when set, receives the inbox metrics
	// (relayd_inbox_processed_total, relayd_inbox_duplicates_total,
	// relayd_inbox_errors_total, each by source). Several Inboxes may
	// register on one Registerer: they share the counters. Default: nil,
	// no metrics.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = max(DefaultRetryMax, c.RetryMin)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.DeriveAMQPID == nil {
		c.DeriveAMQPID = msgid.DeriveID
	}
}

func (c *Config) validate() (schema.Table, error) {
	t, err := schema.ParseTable(c.Table)
	if err != nil {
		return schema.Table{}, fmt.Errorf("inbox: Table: %w", err)
	}
	switch {
	case len(c.Consumer) > maxConsumerLength || !utf8.ValidString(c.Consumer) || strings.ContainsRune(c.Consumer, 0):
		return t, fmt.Errorf("inbox: Consumer %q: want at most %d bytes of UTF-8 without NUL", c.Consumer, maxConsumerLength)
	case c.Retention < 0:
		return t, fmt.Errorf("inbox: Retention %v: must not be negative", c.Retention)
	case c.RetryMin < 0:
		return t, fmt.Errorf("inbox: RetryMin %v: must not be negative", c.RetryMin)
	case c.RetryMax < c.RetryMin:
		return t, fmt.Errorf("inbox: RetryMax %v: must be at least RetryMin (%v)", c.RetryMax, c.RetryMin)
	}
	return t, nil
}

// Inbox records the message ids a consumer group has processed. It is safe
// for concurrent use; any number of instances of a consumer group may share
// one table.
type Inbox struct {
	pool    *pgxpool.Pool
	cfg     Config
	table   schema.Table
	log     *slog.Logger
	metrics *metrics

	insertSQL  string
	cleanupSQL string

	// cleanupHook, when set (tests only), is called after every pass of
	// RunCleanup with the pass's error.
	cleanupHook func(error)
}

// New returns an Inbox on pool's database. It applies cfg's defaults, then
// validates it; it does not touch the database (run [Migrate] first).
func New(pool *pgxpool.Pool, cfg Config) (*Inbox, error) {
	if pool == nil {
		return nil, errors.New("inbox: nil pool")
	}
	cfg.setDefaults()
	table, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("inbox metrics: %w", err)
	}
	tbl := table.Ident()
	return &Inbox{
		pool: pool, cfg: cfg, table: table, log: cfg.Logger, metrics: m,
		insertSQL: `INSERT INTO ` + tbl + ` (consumer, message_id, source, received_at)
VALUES ($1, $2, $3, now()) ON CONFLICT (consumer, message_id) DO NOTHING`,
		cleanupSQL: `DELETE FROM ` + tbl + ` WHERE consumer = $1 AND message_id IN (
	SELECT message_id FROM ` + tbl + `
	WHERE consumer = $1 AND received_at < now() - $2 * interval '1 millisecond'
	ORDER BY received_at LIMIT $3 FOR UPDATE SKIP LOCKED)`,
	}, nil
}

// Process acts once on m for this consumer group. In one transaction it
// records m.ID; if the id was already recorded it commits and returns
// (false, nil) without calling h; otherwise it calls h with the transaction
// and commits, returning (true, nil). If h fails, everything is rolled back
// and h's error is returned (wrapped): the message should be redelivered.
//
// Acknowledge the message to the broker only after Process returned a nil
// error. An error from the final commit is ambiguous (the commit may have
// happened); a redelivery then finds the id recorded, or processes the
// message because nothing was committed — correct either way.
//
// m.ID is normalised (see [Message.ID]) before use and h sees the normalised
// id. An empty id returns [ErrNoMessageID], an unusable one
// [ErrInvalidMessageID]; m.Source must be [SourceAMQP] or [SourceNATS].
func (in *Inbox) Process(ctx context.Context, m Message, h Handler) (processed bool, err error) {
	if h == nil {
		return false, errors.New("inbox: nil handler")
	}
	if m.Source != SourceAMQP && m.Source != SourceNATS {
		return false, fmt.Errorf("inbox: source %q: want %q or %q", m.Source, SourceAMQP, SourceNATS)
	}
	if m.ID, err = normalizeID(m.ID); err != nil {
		in.metrics.error(m.Source)
		return false, err
	}
	defer func() {
		if err != nil {
			in.metrics.error(m.Source)
		}
	}()

	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("inbox: begin: %w", err)
	}
	defer rollback(ctx, tx) // a no-op after Commit

	tag, err := tx.Exec(ctx, in.insertSQL, in.cfg.Consumer, m.ID, m.Source)
	if err != nil {
		return false, in.dbError("record message id", err)
	}
	if tag.RowsAffected() == 0 {
		// Seen: a transaction that recorded the id has committed (ON
		// CONFLICT waited for it if it was in flight).
		if err := tx.Commit(ctx); err != nil {
			return false, fmt.Errorf("inbox: commit: %w", err)
		}
		in.metrics.duplicate(m.Source)
		return false, nil
	}
	if err := h(ctx, tx, m); err != nil {
		rollback(ctx, tx)
		return false, fmt.Errorf("handle %s message %s: %w", m.Source, m.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("inbox: commit: %w", err)
	}
	in.metrics.processed(m.Source)
	return true, nil
}

// rollback rolls tx back even when ctx is done, so the connection goes back
// to the pool clean instead of being closed.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx) // ErrTxClosed after Commit; other errors close the connection
}

// dbError wraps err, naming the fix when the table does not exist.
func (in *Inbox) dbError(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("inbox: %s: table %s does not exist (run inbox.Migrate): %w", what, in.table, err)
	}
	return fmt.Errorf("inbox: %s: %w", what, err)
}

// normalizeID validates id and lower-cases it if it is a UUID in text form
// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, any case). Any other id is kept
// exactly as it is.
func normalizeID(id string) (string, error) {
	switch {
	case id == "":
		return "", ErrNoMessageID
	case len(id) > MaxIDLength:
		return "", fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidMessageID, len(id), MaxIDLength)
	case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
		return "", fmt.Errorf("%w: %q is not UTF-8 text without NUL", ErrInvalidMessageID, id)
	}
	if uuidtext.Is(id) {
		return strings.ToLower(id), nil
	}
	return id, nil
}
