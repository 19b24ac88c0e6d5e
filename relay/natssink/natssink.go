// Package natssink publishes outbox messages to a JetStream stream, for the
// relay's "nats" (new) target.
//
// Each message carries the row's message id as Nats-Msg-Id, so a publish
// repeated inside the stream's duplicate window is stored once; the PubAck
// of such a repeat says Duplicate and counts as delivered. Publishes are
// asynchronous with a bounded window (internal/jspub); every PubAck is read
// on its own, and a publish without one (disconnect, timeout) means
// "unknown: publish again with the same id".
package natssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/outbox"
	"github.com/relayd/relayd/relay"
)

// Config configures a Sink.
type Config struct {
	// Conn is the NATS connection; the caller owns it and should let it
	// reconnect forever (nats.MaxReconnects(-1)). Required.
	Conn *nats.Conn
	// Stream is the JetStream stream messages must land in, unless their
	// route names another. Default "": any stream that captures the subject.
	Stream string
	// SubjectPrefix is prepended to the row's topic. Default "".
	SubjectPrefix string
	// MaxPending bounds the async publishes in flight. Default 4096.
	MaxPending int
	// AckTimeout fails a publish that has no PubAck by then. Default 10s.
	AckTimeout time.Duration
	// DuplicateWindow is the stream's duplicate window (EnsureStream
	// returns it): see RetryBound. Default 2m, JetStream's.
	DuplicateWindow time.Duration
	// OnDuplicate, when set, is called for each PubAck marked Duplicate.
	OnDuplicate func()
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Sink is the relay's JetStream target.
type Sink struct {
	cfg Config
	js  jetstream.JetStream
	pub *jspub.Publisher
	// streamHeader is the Nats-Expected-Stream header's value for the
	// configured stream, shared by its messages (read-only).
	streamHeader []string
	// warn says what the operator must fix on JetStream (route).
	warn *errlog.PerKey
}

var (
	_ relay.Sink         = (*Sink)(nil)
	_ relay.RetryBounder = (*Sink)(nil)
)

// RetryBound keeps the retry of a publish with an unknown outcome inside
// the stream's duplicate window, measured from the first store: half the
// window less the ack timeout (the publish that may have been stored took
// up to that long), and at least a quarter of it.
func (s *Sink) RetryBound() time.Duration {
	w := s.cfg.DuplicateWindow
	return max(w/2-s.cfg.AckTimeout, w/4)
}

// warnKeys bounds the subjects route remembers between warnings.
const warnKeys = 1024

// New returns a sink publishing through cfg.Conn.
func New(cfg Config) (*Sink, error) {
	if cfg.Conn == nil {
		return nil, errors.New("natssink: Conn is required")
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = 4096
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	if cfg.DuplicateWindow <= 0 {
		cfg.DuplicateWindow = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, fmt.Errorf("natssink: %w", err)
	}
	return &Sink{cfg: cfg, js: js, pub: jspub.New(cfg.Conn, cfg.Stream, cfg.MaxPending, cfg.AckTimeout),
		streamHeader: []string{cfg.Stream}, warn: errlog.NewPerKey(cfg.Logger, warnKeys)}, nil
}

// Target implements relay.Sink.
func (s *Sink) Target() relay.Target { return relay.TargetNATS }

// Ready implements relay.Sink.
func (s *Sink) Ready() error {
	if st := s.cfg.Conn.Status(); st != nats.CONNECTED {
		return relay.Unavailable(fmt.Errorf("nats: %s", st))
	}
	return nil
}

// Subject is the subject a topic is published on.
func (s *Sink) Subject(topic string) string { return s.cfg.SubjectPrefix + topic }

// Publish implements relay.Sink.
func (s *Sink) Publish(ctx context.Context, msgs []*relay.Message, results []error) {
	if err := s.Ready(); err != nil {
		for i := range results {
			results[i] = err
		}
		return
	}
	maxPayload := s.cfg.Conn.MaxPayload()
	out := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		subject := s.subject(m)
		if err := outbox.ValidateTopic(subject); err != nil {
			results[i] = relay.Permanent("nats: not a valid subject: %v", err)
			continue
		}
		if reason := badHeaders(m.Headers); reason != "" {
			results[i] = relay.Permanent("nats: headers: %s", reason)
			continue
		}
		// Nats-Msg-Id and Nats-Expected-Stream are set here, in a map
		// made to size.
		msg := &nats.Msg{Subject: subject, Data: m.Payload, Header: make(nats.Header, len(m.Headers)+2)}
		for k, v := range m.Headers {
			msg.Header[k] = []string{v}
		}
		msg.Header[jetstream.MsgIDHeader] = []string{m.MessageID}
		switch stream := s.stream(m); stream {
		case s.cfg.Stream:
			if stream != "" {
				msg.Header[jetstream.ExpectedStreamHeader] = s.streamHeader
			}
		default:
			msg.Header[jetstream.ExpectedStreamHeader] = []string{stream}
		}
		// As nats.go will count it: the data and the headers on the wire.
		if size := jspub.PayloadSize(msg); size > maxPayload {
			results[i] = relay.Permanent("nats: message of %d bytes with its headers exceeds the server's max_payload %d", size, maxPayload)
			continue
		}
		out[i] = msg
	}
	dup := make([]bool, len(msgs))
	s.pub.Publish(ctx, out, results, dup)
	lookup := jspub.NewLookup(s.js)
	for i, m := range out {
		switch {
		case m == nil:
		case results[i] == nil:
			if dup[i] && s.cfg.OnDuplicate != nil {
				s.cfg.OnDuplicate()
			}
		default:
			results[i] = s.route(ctx, msgs[i], classify(results[i]), lookup)
			stream := s.stream(msgs[i])
			if stream == "" && jspub.MaxBytesRefused(results[i]) { // asked only for this refusal
				stream = lookup.StreamOf(ctx, m.Subject)
			}
			if maxBytes, tooLarge := lookup.TooLarge(ctx, stream, m, results[i]); tooLarge {
				results[i] = relay.Permanent("nats: message of about %d bytes is larger than stream %s's MaxBytes %d", jspub.StoredSize(m), stream, maxBytes)
			}
		}
	}
}

// route settles the refusals that say where a subject goes (jspub.WhereTo):
// the configured stream missing pauses the target (ErrNoStream); existing
// without the subject, the row is retried and counts an attempt
// (ErrNotCaptured). A route's own stream missing, or without its subject,
// holds that route's rows (relay.ErrNoDestination). Each is said at once,
// then every errlog.Every.
func (s *Sink) route(ctx context.Context, m *relay.Message, err error, lookup jspub.StreamLookup) error {
	subject, stream := s.subject(m), s.stream(m)
	where := jspub.WhereTo(ctx, lookup, err, subject, stream)
	if where == jspub.WhereElse {
		return err
	}
	if where == jspub.WhereUnknown {
		return relay.Unavailable(err)
	}
	routed := m.Route != nil && m.Route.Stream != "" && m.Route.Stream != s.cfg.Stream // a route's own stream
	if where == jspub.WhereNoStream {
		if routed {
			// One route's stream: its rows wait, the others go on.
			s.warn.Warn("stream "+stream, "JetStream has no stream "+stream+", which a route names: that route's rows wait, and are delivered once it exists. "+
				"Create the stream, or change the route's nats.stream",
				"stream", stream, "subject", subject, "server", s.cfg.Conn.ConnectedUrlRedacted())
			return relay.NoDestination(fmt.Errorf("nats: %w: %s (subject %q)", ErrNoStream, stream, subject))
		}
		s.warn.Warn("stream "+stream, "JetStream has no stream "+stream+" (RELAY_NATS_STREAM): the target waits, and every row is delivered once it exists. "+
			"Create the stream, or set RELAY_NATS_STREAM to the stream that captures the subjects",
			"stream", stream, "subject", subject, "server", s.cfg.Conn.ConnectedUrlRedacted())
		return relay.Unavailable(fmt.Errorf("nats: %w: %s (subject %q)", ErrNoStream, stream, subject))
	}
	setting := "RELAY_NATS_STREAM"
	if routed {
		setting = "the route's nats.stream"
	}
	var what, fix string
	switch {
	case stream == "":
		what, fix = "no stream captures a row's subject", "add the subject to a stream's subjects, or check the row's topic and route"
	case where == jspub.WhereOtherStream:
		what, fix = "stream "+stream+" does not capture a row's subject", "another stream captures it: move the subject to stream "+stream+", or set "+setting+" to that stream"
	default:
		what, fix = "stream "+stream+" does not capture a row's subject", "add the subject to stream "+stream+"'s subjects, or check the row's topic and route"
	}
	err = fmt.Errorf("nats: %w: stream %q, subject %q: %s", ErrNotCaptured, stream, subject, fix)
	if routed {
		// The route names both the stream and the subject: the operator's
		// to fix, not the row's. Its rows wait.
		s.warn.Warn("subject "+subject, what+": "+fix+"; until then that route's rows wait",
			"stream", stream, "subject", subject, "server", s.cfg.Conn.ConnectedUrlRedacted(), "message_id", m.MessageID)
		return relay.NoDestination(err)
	}
	s.warn.Warn("subject "+subject, what+": "+fix+"; until then the row is retried, and parked when its attempts run out",
		"stream", stream, "subject", subject, "server", s.cfg.Conn.ConnectedUrlRedacted(), "message_id", m.MessageID)
	return err
}
