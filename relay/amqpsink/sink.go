// Package amqpsink is the relay's RabbitMQ ("amqp", legacy) target: it
// publishes outbox messages to an exchange with publisher confirms, and
// counts a message delivered only when RabbitMQ acked it without returning it.
//
// Messages go persistent and mandatory; an unroutable one comes back as
// basic.return before its ack (the sink applies returns and confirms in the
// order RabbitMQ sent them), and is retried. A lost connection resolves
// pending publishes as unknown and the sink reconnects by itself, to the next
// node of a cluster's URL list; so does a connection on which RabbitMQ has
// acked nothing for StallTimeout. A publish unanswered at its deadline stays
// registered: its late confirm goes to OnLateConfirm and answers a retry of
// the same message. A connection RabbitMQ blocks (a resource alarm) is kept,
// and the sink is not Ready until RabbitMQ unblocks it.
package amqpsink

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/relay"
)

// Config configures a Sink.
type Config struct {
	// URL is the RabbitMQ URL, amqp:// or amqps://, or the URLs of a
	// cluster's nodes separated by commas (amqpio.SplitURLs). Nodes are
	// tried in order; after a connection loss, from the next node on.
	// Required.
	URL string
	// Exchange is where messages are published, with the row's topic as the
	// routing key. Required.
	Exchange string
	// TLS, when set, is used for amqps:// connections. Default: system roots.
	TLS *tls.Config
	// Logger receives connection events. Default: discard.
	Logger *slog.Logger
	// StallTimeout is how long RabbitMQ may ack nothing while publishes wait
	// or are nacked, on a connection it has not blocked, before the sink
	// closes the connection and connects again (to the next node): what
	// waits is then unknown, as on any lost connection. A channel opened as
	// a quorum queue's leader was lost nacks everything. Default
	// StallTimeoutDefault (30 s).
	StallTimeout time.Duration
	// HoldAfter is how long RabbitMQ may ack nothing while publishes wait
	// before nothing new goes onto the connection until it answers or is
	// replaced: a message never sent there is not sent twice when the
	// connection is lost (docs/design.md, "Never re-sent to a broker that
	// confirmed it"). Default StallTimeout / 2.
	HoldAfter time.Duration

	// wrapConn, in tests, wraps each TCP connection below the cork.
	wrapConn func(net.Conn) net.Conn
	// beforeEvent, in tests, runs on the event goroutine before each
	// return or confirm is applied (to hold that goroutine up).
	beforeEvent func()
}

// Sink is the relay's RabbitMQ target.
type Sink struct {
	cfg   Config
	log   *slog.Logger
	nodes *amqpio.Nodes

	mu      sync.Mutex
	cur     *link // nil while disconnected
	lastErr error

	// late holds message ids RabbitMQ confirmed after their publish gave up
	// waiting: a retry of such a row is already delivered (see late.go).
	lateMu sync.Mutex
	late   map[string]time.Time
	onLate func(msgID string) // see OnLateConfirm

	unroutable *unroutableWarner
	// nacked says, per topic, that RabbitMQ nacked its messages (Publish).
	nacked *errlog.PerKey
	// missing says, per exchange, that a route names one RabbitMQ lacks.
	missing *errlog.PerKey

	stop    chan struct{}
	stopped chan struct{}
}

var (
	_ relay.Sink          = (*Sink)(nil)
	_ relay.LateConfirmer = (*Sink)(nil)
)

// New connects to RabbitMQ and returns a sink that stays connected until
// Close: after a connection loss it reconnects with capped backoff. New
// fails if the first connection cannot be made before ctx is done.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if cfg.URL == "" {
		return nil, errors.New("amqpsink: URL is required")
	}
	if cfg.Exchange == "" {
		return nil, errors.New("amqpsink: Exchange is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.StallTimeout = cmp.Or(cfg.StallTimeout, StallTimeoutDefault)
	cfg.HoldAfter = cmp.Or(cfg.HoldAfter, cfg.StallTimeout/2)
	s := &Sink{cfg: cfg, log: cfg.Logger.With("target", "amqp"), nodes: amqpio.NewNodes(cfg.URL),
		stop: make(chan struct{}), stopped: make(chan struct{}), late: map[string]time.Time{}}
	s.unroutable = newUnroutableWarner(s.log)
	s.nacked = errlog.NewPerKey(s.log, unroutableTopics)
	s.missing = errlog.NewPerKey(s.log, unroutableTopics)
	var first *link
	var err error
	for {
		first, err = s.connect()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("amqp: connect: %w", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	s.log.Info("amqp connected", "node", first.node)
	s.cur = first // ready as soon as New returns
	go s.supervise(first)
	return s, nil
}

// Target implements relay.Sink.
func (s *Sink) Target() relay.Target { return relay.TargetAMQP }

// Ready implements relay.Sink.
func (s *Sink) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		return s.cur.blockedErr()
	}
	if s.lastErr != nil {
		return relay.Unavailable(s.lastErr)
	}
	return relay.Unavailable(errors.New("amqp: not connected"))
}

// Close disconnects; pending publishes resolve as unavailable.
func (s *Sink) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.stopped
	return nil
}

// current is the live link, nil while disconnected.
func (s *Sink) current() *link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// blockedBy logs RabbitMQ blocking (reason) and unblocking ("") the
// connection.
func (s *Sink) blockedBy(reason string) {
	if reason != "" {
		s.log.Warn("RabbitMQ blocked the connection (resource alarm): publishing paused until it clears", "reason", reason)
		return
	}
	s.log.Info("RabbitMQ unblocked the connection: publishing again")
}
