// Package backfill drains a legacy RabbitMQ queue into the JetStream stream,
// losing and duplicating nothing.
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
package backfill

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/time/rate"

	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/outbox"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// DerivedIDHeader marks a message whose id was derived from its content
// (it had no AMQP message-id); its value is the id.
const DerivedIDHeader = "Relay-Derived-Id"

// ReasonHeader carries, on a dead-lettered message, why JetStream refused it.
const ReasonHeader = "x-relay-dead-letter-reason"

// The headers with which a dead-lettered message keeps where it was
// published to — the dead-letter publish goes through the default exchange
// to the dead-letter queue, and a message re-driven from there needs its
// routing key (its subject) and exchange — and its expiration, which it
// does not keep as a property (it would expire in the dead-letter queue).
const (
	RoutingKeyHeader = "x-relay-original-routing-key"
	ExchangeHeader   = "x-relay-original-exchange"
	ExpirationHeader = "x-relay-original-expiration"
)

// Config configures a backfill run.
type Config struct {
	// AMQPURL and Queue name the legacy queue to drain. Required.
	AMQPURL string
	Queue   string
	// TLS is used for amqps:// URLs. Default: system roots.
	TLS *tls.Config
	// Prefetch is how many deliveries are unacked at once. Default
	// DefaultPrefetch (4,096).
	Prefetch int
	// NATS is the connection to JetStream; the caller owns it. Required.
	NATS *nats.Conn
	// Stream must receive every message. Required.
	Stream string
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
	// PublishTimeout bounds the wait for a PubAck. Default 10s.
	PublishTimeout time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
	// OnProgress, when set, is called after every batch and at the end.
	OnProgress func(Progress)
}

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
	Duplicates       int64         `json:"duplicates"`        // of the moved, how many JetStream already held (a repeat within its duplicate window: dropped, not stored twice)
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

// ErrNotDualWrite is returned when a relayd instance finished rows lately
// without JetStream (see relay.FinishedWithoutNATS): the backfill needs every
// instance in dual write.
var ErrNotDualWrite = errors.New("the relays are not all in dual write")

// ErrHeldFull is returned when the messages JetStream refuses for good, held
// unacked for want of a dead-letter queue, take the whole prefetch: RabbitMQ
// delivers nothing more, and the run could not finish.
var ErrHeldFull = errors.New("refused messages hold the prefetch")

func (c *Config) applyDefaults() error {
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 10 * time.Second
	}
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
	b := &runner{cfg: cfg, log: cfg.Logger, start: time.Now(), seenHeld: map[string]bool{}, retrying: map[string]int{}}
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

type runner struct {
	cfg     Config
	log     *slog.Logger
	js      jetstream.JetStream // stream lookups
	pub     *jspub.Publisher
	limiter *rate.Limiter
	start   time.Time
	depth0  int64

	moved, already, derived, dups, dead, failed, requeued atomic.Int64
	lastRequeue                                           atomic.Int64 // unix ns

	mu       sync.Mutex
	seenHeld map[string]bool // ids refused for good and held this run
	// retrying: how many times each message could not move for now (a
	// full stream, JetStream down), until it moves; see retryWait.
	retrying      map[string]int
	nRetrying     atomic.Int64 // len(retrying)
	lastGhostWarn time.Time    // the main loop's alone (drained)
	lastRetryWarn time.Time
	dualWriteAt   time.Time // the database's time of the last checkDualWrite that passed
	dualWriteFrom time.Time // the first row that reached JetStream at the first check (zero: none)
	lastDualWrite time.Time // when checkDualWrite was last tried (the session loop's)
	lastDupWarn   time.Time
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

// preflight checks the queue, its other consumers, and the stream.
func (b *runner) preflight(ctx context.Context) error {
	conn, err := amqp.DialTLS(b.cfg.AMQPURL, b.cfg.TLS)
	if err != nil {
		return fmt.Errorf("amqp: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: channel: %w", err)
	}
	q, err := ch.QueueDeclarePassive(b.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("amqp: queue %q: %w", b.cfg.Queue, err)
	}
	// A consumer whose process just died (a crashed earlier run) is still
	// counted until RabbitMQ has closed its connection: give it a moment.
	for wait := 0; q.Consumers > 0 && !b.cfg.AllowOtherConsumers && wait < 10; wait++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if q, err = ch.QueueDeclarePassive(b.cfg.Queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: queue %q: %w", b.cfg.Queue, err)
		}
	}
	b.depth0 = int64(q.Messages)
	if q.Consumers > 0 {
		if !b.cfg.AllowOtherConsumers {
			return fmt.Errorf("%w: queue %q has %d consumer(s) that would take some of its messages; stop them, or pass --allow-other-consumers", ErrOtherConsumers, b.cfg.Queue, q.Consumers)
		}
		b.log.Warn("other consumers share the queue: they will take some of its messages", "queue", b.cfg.Queue, "consumers", q.Consumers)
	}
	if b.cfg.DeadLetterQueue != "" && !b.cfg.DryRun {
		ch2, err := conn.Channel()
		if err != nil {
			return err
		}
		if _, err := ch2.QueueDeclarePassive(b.cfg.DeadLetterQueue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: dead-letter queue %q: %w (declare it first)", b.cfg.DeadLetterQueue, err)
		}
	}
	if _, err := b.js.Stream(ctx, b.cfg.Stream); err != nil {
		return fmt.Errorf("nats: stream %q: %w", b.cfg.Stream, err)
	}
	// The backfill skips a message whose row is still in the outbox owed to
	// JetStream: the relay will deliver it. An instance without nats in
	// RELAY_TARGETS never will, and the message it has in flight (its copy
	// in the queue before its confirm is recorded) would reach JetStream by
	// neither. Checked again every dualWriteRecheck while the run goes on:
	// a quiet outbox proves nothing (an instance on RELAY_TARGETS=amqp that
	// has finished nothing lately shows only once it does).
	if err := b.checkDualWrite(ctx); err != nil {
		if !b.cfg.DryRun || !errors.Is(err, ErrNotDualWrite) {
			return err
		}
		b.log.Warn("backfill: a real run would refuse to start", "error", err.Error())
	}
	b.log.Info("backfill starting", "queue", b.cfg.Queue, "depth", b.depth0, "stream", b.cfg.Stream, "dry_run", b.cfg.DryRun)
	return nil
}

// checkDualWrite fails with ErrNotDualWrite when rows left the outbox
// without JetStream: at the first check, in the last dualWriteLookback,
// after the first that reached JetStream; then since the last check.
func (b *runner) checkDualWrite(ctx context.Context) error {
	since := b.dualWriteAt
	if !since.IsZero() {
		// A record committed after the last check may bear an earlier
		// done_at; rows before the first that reached JetStream are
		// from before dual write.
		since = since.Add(-time.Minute)
		if since.Before(b.dualWriteFrom) {
			since = b.dualWriteFrom
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, first, at, err := relay.FinishedWithoutNATS(ctx, b.cfg.DB, b.cfg.Table, dualWriteLookback, since)
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", b.cfg.Table.Delivered(), err)
	}
	if n > 0 {
		return fmt.Errorf("%w: %d rows left %s lately without reaching JetStream: a relayd instance runs without nats in RELAY_TARGETS, and the messages it has in flight would reach JetStream by neither it nor the backfill; switch every instance to RELAY_TARGETS=amqp,nats, then run the backfill",
			ErrNotDualWrite, n, b.cfg.Table)
	}
	if b.dualWriteAt.IsZero() {
		b.dualWriteFrom = first
	}
	b.dualWriteAt, b.lastDualWrite = at, time.Now()
	return nil
}

// dualWriteLookback is how far back the first checkDualWrite looks: the
// check walks the rows finished in it, a million in two minutes of a busy
// dual write; the checks every dualWriteRecheck after it watch for the
// instances that were quiet then.
const dualWriteLookback = 2 * time.Minute

// dualWriteRecheck is how often a run checks that every instance is still
// in dual write (checkDualWrite).
const dualWriteRecheck = 30 * time.Second

// item is one delivery on its way.
type item struct {
	d       amqp.Delivery
	acks    *acker // settles d
	id      string
	derived bool
	subject string
	msg     *nats.Msg
	bad     string // why JetStream can never take it, or ""
}

func (b *runner) prepare(d amqp.Delivery) *item {
	it := &item{d: d, id: d.MessageId}
	if it.id == "" {
		it.id, it.derived = DeriveID(d), true
	}
	key := b.mapKey(d.RoutingKey)
	it.subject = b.cfg.SubjectPrefix + key
	if err := outbox.ValidateTopic(key); err != nil {
		it.bad = fmt.Sprintf("routing key %q is not a valid subject: %v", key, err)
		return it
	}
	// A header key NATS refuses would fail the publish every time (nats.go
	// refuses the whole message), and a Nats- header would tell JetStream
	// what to do with it (Nats-Rollup purges the subject): refused for good.
	if reason := badHeaderKey(d.Headers); reason != "" {
		it.bad = "header " + reason
		return it
	}
	it.msg = &nats.Msg{Subject: it.subject, Data: d.Body, Header: natsHeaders(d)}
	if it.derived {
		it.msg.Header.Set(DerivedIDHeader, it.id)
	}
	// Nats-Msg-Id and Nats-Expected-Stream are set here rather than by
	// jetstream.WithMsgID and WithExpectStream: the same headers, without
	// the options' allocations per message.
	it.msg.Header[jetstream.MsgIDHeader] = []string{it.id}
	it.msg.Header[jetstream.ExpectedStreamHeader] = []string{b.cfg.Stream}
	if size := jspub.PayloadSize(it.msg); size > b.cfg.NATS.MaxPayload() {
		it.bad = fmt.Sprintf("message of %d bytes with its headers exceeds the NATS server's max_payload %d", size, b.cfg.NATS.MaxPayload())
	}
	return it
}

func (b *runner) mapKey(key string) string {
	best := ""
	for from := range b.cfg.SubjectMap {
		if strings.HasPrefix(key, from) && len(from) > len(best) {
			best = from
		}
	}
	if best == "" {
		return key
	}
	return b.cfg.SubjectMap[best] + strings.TrimPrefix(key, best)
}

// badHeaderKey says why one of t's keys cannot be a NATS header, or "" —
// the first in key order, so a message always gets the same reason.
// Nats-Msg-Id and Nats-Expected-Stream are not refused: prepare sets them.
func badHeaderKey(t amqp.Table) string {
	return headers.First(t, func(k string, _ any) string {
		if k == jetstream.MsgIDHeader || k == jetstream.ExpectedStreamHeader {
			return ""
		}
		return cmp.Or(headers.NATSKeyReason(k), headers.NATSReservedReason(k))
	})
}

// natsHeaders carries the AMQP headers and the useful properties over.
func natsHeaders(d amqp.Delivery) nats.Header {
	// Room for the properties below and the three headers prepare adds.
	h := make(nats.Header, len(d.Headers)+8)
	for k, v := range d.Headers {
		h[k] = []string{headerValue(v)}
	}
	if d.ContentType != "" {
		h.Set("Content-Type", d.ContentType)
	}
	if d.CorrelationId != "" {
		h.Set("Correlation-Id", d.CorrelationId)
	}
	if !d.Timestamp.IsZero() {
		h.Set("Amqp-Timestamp", d.Timestamp.UTC().Format(time.RFC3339))
	}
	if d.Type != "" {
		h.Set("Amqp-Type", d.Type)
	}
	h.Set("Amqp-Routing-Key", d.RoutingKey)
	return h
}

func headerValue(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case nil:
		return ""
	default:
		if b, err := json.Marshal(x); err == nil {
			return string(b)
		}
		return fmt.Sprint(x)
	}
}

// brokerHeaders are the headers RabbitMQ adds to a message on its way: a
// quorum queue's count of deliveries (on each redelivery), dead-lettering's
// history, and the federation/shovel hop. They say what happened to the
// message, not what it is, and stay out of its derived id.
var brokerHeaders = map[string]bool{
	"x-delivery-count":       true,
	"x-death":                true,
	"x-first-death-exchange": true,
	"x-first-death-queue":    true,
	"x-first-death-reason":   true,
	"x-last-death-exchange":  true,
	"x-last-death-queue":     true,
	"x-last-death-reason":    true,
	"x-received-from":        true,
}

// DeriveID is the id of a message that has no message-id: a UUID (version
// 8, RFC 9562) built from the SHA-256 of its routing key, timestamp, type,
// correlation id, content type, headers (sorted by name; not those RabbitMQ
// adds on the way, brokerHeaders) and body. The same message always gets the
// same id — redelivered, dead-lettered and consumed again — so a rerun after
// a crash publishes it with the same Nats-Msg-Id, and an inbox reading the
// legacy queue finds the id of its backfilled copy. Two messages identical in
// all of these are treated as one.
func DeriveID(d amqp.Delivery) string {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field(d.RoutingKey)
	if !d.Timestamp.IsZero() {
		field(d.Timestamp.UTC().Format(time.RFC3339Nano))
	} else {
		field("")
	}
	field(d.Type)
	field(d.CorrelationId)
	field(d.ContentType)
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		if !brokerHeaders[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		field(k)
		field(headerValue(d.Headers[k]))
	}
	field(string(d.Body))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x80 // version 8
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	s := hex.EncodeToString(u[:])
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}
