package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/headers/amqpprop"
	"github.com/relayd/relayd/relay"
)

const tailHelp = `Usage: relayd tail [--json] [--connect-timeout D]

Prints each message that reaches the JetStream stream (RELAY_NATS_STREAM)
and the RabbitMQ exchange (RELAY_AMQP_EXCHANGE) from now on, one line each,
until Ctrl-C: time, broker, topic, message id, size, headers and the start
of the payload. Like nats sub: for the quick start and for debugging.

The stream is read by an ephemeral consumer (new messages only), the
exchange through a temporary queue of tail's own (server-named, exclusive,
auto-delete, bound with "#"), gone when tail exits. While tail runs, that
queue makes every topic routable: a message no other queue takes is
delivered to it, and seen only here, instead of returned to relayd.

Reads the brokers' RELAY_* variables as relayd run does (URLs, credentials,
TLS, stream, subject prefix, exchange) and RELAY_TARGETS for which brokers
to watch. It does not connect to Postgres.

Flags:
`

// tailPreviewBytes bounds the payload shown for each message.
const tailPreviewBytes = 64

// arrival is one message tail saw, as --json prints it.
type arrival struct {
	ReceivedAt time.Time         `json:"received_at"`
	Broker     string            `json:"broker"`
	Topic      string            `json:"topic"`
	MessageID  string            `json:"message_id"`
	Subject    string            `json:"subject,omitempty"`
	StreamSeq  uint64            `json:"stream_sequence,omitempty"`
	Exchange   string            `json:"exchange,omitempty"`
	Headers    map[string]string `json:"headers,omitempty"`
	SizeBytes  int               `json:"size_bytes"`
	Preview    string            `json:"payload_preview"`
	Truncated  bool              `json:"payload_truncated"`
}

// tailCommand is relayd tail.
type tailCommand struct {
	*cli
	asJSON         bool
	connectTimeout time.Duration
}

func (c *tailCommand) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.BoolVar(&c.asJSON, "json", false, "one JSON object per line, for scripts")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *tailCommand) Usage() string { return withFlagDefaults(c.flags(), tailHelp) }

func (c *tailCommand) Run(ctx context.Context, args []string) error {
	if err := parseFlags(c.flags(), args); err != nil {
		return err
	}
	if err := checkConnectTimeout(c.connectTimeout); err != nil {
		return err
	}
	cfg, err := c.config(noDatabase{c.env})
	if err != nil {
		return err
	}
	cfg.StartupTimeout = c.connectTimeout
	log := c.log
	// Ctrl-C is how tail ends: exit 0, nothing in flight to finish.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	arrivals := make(chan arrival, 256)
	failed := make(chan error, 2)
	var watching []any
	if cfg.wants(relay.TargetNATS) {
		if err := cfg.needStream(); err != nil {
			return asConfigError(err)
		}
		closeNATS, err := tailNATS(ctx, cfg, log, arrivals)
		if err != nil {
			if u, ok := errors.AsType[unreachable](err); ok {
				return errors.New(natsFailure(cfg, u.err))
			}
			return logged("tail", err)
		}
		defer closeNATS()
		watching = append(watching, "stream", cfg.NATSStream)
	}
	if cfg.wants(relay.TargetAMQP) {
		queue, closeAMQP, err := tailAMQP(ctx, cfg, arrivals, failed)
		if err != nil {
			if u, ok := errors.AsType[unreachable](err); ok {
				return errors.New(amqpFailure(cfg, 0, u.err))
			}
			return logged("tail", err)
		}
		defer closeAMQP()
		watching = append(watching, "exchange", cfg.AMQPExchange, "queue", queue)
	}
	log.Info("tail: waiting for messages (Ctrl-C to stop)", watching...)
	for {
		select {
		case a := <-arrivals:
			if err := printArrival(c.stdout, a, c.asJSON); err != nil {
				return &silentError{err} // stdout gone (a closed pipe)
			}
		case err := <-failed:
			return logged("tail", err)
		case <-ctx.Done():
			return nil
		}
	}
}

// unreachable is a broker tail could not connect to, which it prints as
// one line.
type unreachable struct{ err error }

func (u unreachable) Error() string { return u.err.Error() }
func (u unreachable) Unwrap() error { return u.err }

// noDatabase answers RELAY_DATABASE_URL with a placeholder: the config
// requires it, and tail never connects to Postgres. Nor is its password
// file read.
type noDatabase struct{ envconfig.Lookuper }

func (n noDatabase) Lookup(key string) (string, bool) {
	switch key {
	case "RELAY_DATABASE_URL":
		return "postgres://tail.invalid/unused", true
	case "RELAY_DATABASE_PASSWORD_FILE":
		return "", false
	}
	return n.Lookuper.Lookup(key)
}

// tailNATS reads the stream's new messages with an ordered consumer:
// ephemeral, and recreated by nats.go where it left off after a reconnect.
func tailNATS(ctx context.Context, cfg *config, log *slog.Logger, out chan<- arrival) (func(), error) {
	nc, err := dialNATS(ctx, cfg, log, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, unreachable{err}
	}
	cc, err := consumeNew(ctx, nc, cfg.NATSStream, func(m jetstream.Msg) { send(ctx, out, natsArrival(m, cfg.NATSSubjectPrefix)) }, log)
	if err != nil {
		nc.Close()
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("nats: stream %q does not exist (start relayd run with RELAY_PROVISION=true, or create it)", cfg.NATSStream)
		}
		return nil, fmt.Errorf("nats: consume stream %q: %w", cfg.NATSStream, err)
	}
	return func() { cc.Stop(); nc.Close() }, nil
}

// consumeNew has handle called with each message stored in stream from now
// on.
func consumeNew(ctx context.Context, nc *nats.Conn, stream string, handle jetstream.MessageHandler, log *slog.Logger) (jetstream.ConsumeContext, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, err
	}
	return cons.Consume(handle, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		log.Warn("tail: nats consumer", "error", err.Error()) // nats.go recovers; this says why nothing arrives meanwhile
	}))
}

// tailAMQP binds a temporary queue of its own to the exchange with "#" and
// reads it. A lost channel or connection ends tail (failed): the queue
// went with it.
func tailAMQP(ctx context.Context, cfg *config, out chan<- arrival, failed chan<- error) (string, func(), error) {
	tlsCfg, err := cfg.amqpTLS()
	if err != nil {
		return "", nil, err
	}
	conn, err := amqpio.DialURL(cfg.AMQPURL, amqpio.DialOptions{TLS: tlsCfg, Name: "relayd tail", Timeout: cfg.StartupTimeout})
	if err != nil {
		return "", nil, unreachable{err}
	}
	q, closed, deliveries, err := tailQueue(conn, cfg.AMQPExchange)
	if err != nil {
		conn.Close()
		return "", nil, err
	}
	go func() {
		for d := range deliveries {
			send(ctx, out, amqpArrival(d))
		}
		// Deliveries end with the channel, or when RabbitMQ cancels the
		// consumer (the queue deleted): either way, nothing more comes.
		err := errors.New("amqp: RabbitMQ cancelled tail's consumer (its queue was deleted)")
		select {
		case e := <-closed:
			if e != nil {
				err = fmt.Errorf("amqp: channel closed: %w", e)
			}
		case <-time.After(time.Second):
		}
		select {
		case failed <- err:
		case <-ctx.Done(): // tail is stopping: its own close
		}
	}()
	return q, func() { conn.Close() }, nil
}

// tailQueue declares the temporary queue, binds and consumes it; closed
// tells why its channel closed (a channel closes with its connection, with
// the connection's error).
func tailQueue(conn *amqp.Connection, exchange string) (queue string, closed <-chan *amqp.Error, _ <-chan amqp.Delivery, _ error) {
	ch, err := conn.Channel()
	if err != nil {
		return "", nil, nil, fmt.Errorf("amqp: channel: %w", err)
	}
	closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	// Not durable, auto-delete, exclusive: RabbitMQ drops it with the
	// connection, so tail never leaves a queue behind to fill up.
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return "", nil, nil, fmt.Errorf("amqp: declare a temporary queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return "", nil, nil, fmt.Errorf("amqp: exchange %q does not exist (start relayd run with RELAY_PROVISION=true, or create it)", exchange)
		}
		return "", nil, nil, fmt.Errorf("amqp: bind %s to exchange %q: %w", q.Name, exchange, err)
	}
	deliveries, err := ch.Consume(q.Name, "relayd-tail", true, true, false, false, nil)
	if err != nil {
		return "", nil, nil, fmt.Errorf("amqp: consume %s: %w", q.Name, err)
	}
	return q.Name, closed, deliveries, nil
}

func send(ctx context.Context, out chan<- arrival, a arrival) {
	select {
	case out <- a:
	case <-ctx.Done():
	}
}

func natsArrival(m jetstream.Msg, prefix string) arrival {
	a := arrival{ReceivedAt: time.Now(), Broker: "nats", Subject: m.Subject(), Topic: strings.TrimPrefix(m.Subject(), prefix)}
	for k, v := range m.Headers() {
		if k == jetstream.MsgIDHeader {
			a.MessageID = strings.Join(v, ",")
			continue
		}
		if strings.HasPrefix(k, "Nats-") {
			continue // JetStream's own, not the row's
		}
		if a.Headers == nil {
			a.Headers = map[string]string{}
		}
		a.Headers[k] = strings.Join(v, ",")
	}
	if md, err := m.Metadata(); err == nil {
		a.StreamSeq = md.Sequence.Stream
	}
	a.setPayload(m.Data())
	return a
}

func amqpArrival(d amqp.Delivery) arrival {
	a := arrival{ReceivedAt: time.Now(), Broker: "amqp", Topic: d.RoutingKey, MessageID: d.MessageId, Exchange: d.Exchange}
	for k, v := range d.Headers {
		if a.Headers == nil {
			a.Headers = map[string]string{}
		}
		a.Headers[k] = fmt.Sprint(v)
	}
	for k, v := range amqpprop.FromDelivery(&d) { // the properties a row's headers set
		if a.Headers == nil {
			a.Headers = map[string]string{}
		}
		a.Headers[k] = v
	}
	a.setPayload(d.Body)
	return a
}

func (a *arrival) setPayload(b []byte) {
	a.SizeBytes = len(b)
	a.Preview, a.Truncated = preview(b, tailPreviewBytes)
}

// preview is the start of b, at most n bytes of it, printable: control
// characters and bytes that are not UTF-8 are escaped as Go would quote
// them.
func preview(b []byte, n int) (string, bool) {
	var s strings.Builder
	for i := 0; i < len(b); {
		if i >= n {
			return s.String(), true
		}
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&s, `\x%02x`, b[i])
		case unicode.IsPrint(r):
			s.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			s.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return s.String(), false
}

// printArrival writes one arrival: a JSON object, or a line for people.
func printArrival(w io.Writer, a arrival, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(a)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-4s %s message_id=%s size=%dB", a.ReceivedAt.Format("15:04:05.000"), a.Broker, a.Topic, a.MessageID, a.SizeBytes)
	if len(a.Headers) > 0 {
		b.WriteString(" headers=")
		for i, k := range slices.Sorted(maps.Keys(a.Headers)) {
			if i > 0 {
				b.WriteByte(',')
			}
			v, _ := preview([]byte(a.Headers[k]), tailPreviewBytes)
			fmt.Fprintf(&b, "%s=%s", k, v)
		}
	}
	b.WriteString(" payload=" + a.Preview)
	if a.Truncated {
		b.WriteString("…")
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}
