package amqpsink_test

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/sinktest"
)

// dropWrites pretends to write while drop is set: RabbitMQ never hears of
// what is published, and answers nothing, as on a quorum queue channel left
// without a leader.
type dropWrites struct {
	net.Conn
	drop *atomic.Bool
}

func (d dropWrites) Write(p []byte) (int, error) {
	if d.drop.Load() {
		return len(p), nil
	}
	return d.Conn.Write(p)
}

// Publishes that RabbitMQ leaves unanswered for StallTimeout, on a
// connection it has not blocked: the sink closes the connection, the
// publishes end unknown (not at their own deadline, far later), and on the
// new connection they are confirmed, each queued once.
func TestStalledConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	var drop atomic.Bool
	var log testenv.SyncBuffer
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		c.StallTimeout = time.Second
		c.Logger = slog.New(slog.NewJSONHandler(&log, nil))
		amqpsink.WrapConn(c, func(nc net.Conn) net.Conn {
			if conns.Add(1) == 1 {
				return dropWrites{Conn: nc, drop: &drop}
			}
			return nc
		})
	})
	msgs := sinktest.Messages("stalled", 10)
	drop.Store(true)
	start := time.Now()
	sinktest.RequireAllUnavailable(t, msgs, sinktest.Publish(t, e.sink, 30*time.Second, msgs))
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the stalled publishes ended after %v, want about the stall timeout (1s)", took)
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return conns.Load() == 2 && e.sink.Ready() == nil },
		"the sink did not connect again: %d connections", lazyCount{&conns})
	if out := log.String(); !strings.Contains(out, "no ack for 1s (0 nacks, 10 publishes waiting)") {
		t.Errorf("the log does not say why the connection was closed:\n%s", out)
	}
	sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 15*time.Second, msgs))
	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), msgs, 1)
}

// An idle connection, and one whose publishes are answered, is kept.
func TestAnsweredConnectionIsKept(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		c.StallTimeout = 2 * time.Second
		amqpsink.WrapConn(c, func(nc net.Conn) net.Conn { conns.Add(1); return nc })
	})
	for i := range 5 {
		msgs := sinktest.Messages("answered", 50)
		sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 15*time.Second, msgs))
		if i == 2 {
			time.Sleep(2500 * time.Millisecond) // idle past the stall timeout: pacing, not a wait for a result
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want the first kept", n)
	}
}

// A channel on which RabbitMQ nacks everything (here: a full queue with
// x-overflow reject-publish; on RabbitMQ 3.10, a channel opened as a quorum
// queue's leader was lost) and acks nothing for StallTimeout is replaced
// too; once the queue has room, the messages are confirmed on the new one.
func TestNackingConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	var log testenv.SyncBuffer
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		c.StallTimeout = time.Second
		c.Logger = slog.New(slog.NewJSONHandler(&log, nil))
		amqpsink.WrapConn(c, func(nc net.Conn) net.Conn { conns.Add(1); return nc })
	})
	ch := testenv.ConfirmChannel(t)
	full := e.queue + "_full"
	if _, err := ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	defer ch.QueueDelete(full, false, false, false) //nolint:errcheck // the test's own queue
	if err := ch.QueueBind(full, sinktest.TopicPrefix+"full.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	msgs := sinktest.Messages("full", 5)
	for _, err := range sinktest.Publish(t, e.sink, 15*time.Second, msgs) {
		if !errors.Is(err, relay.ErrNacked) {
			t.Fatalf("into the full queue: %v, want a nack", err)
		}
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return conns.Load() == 2 && e.sink.Ready() == nil },
		"the sink kept the nacking connection: %d connections", lazyCount{&conns})
	if out := log.String(); !strings.Contains(out, "no ack for 1s (5 nacks") {
		t.Errorf("the log does not say why the connection was closed:\n%s", out)
	}
	if err := ch.QueueUnbind(full, sinktest.TopicPrefix+"full.#", e.exchange, nil); err != nil {
		t.Fatal(err)
	}
	sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 15*time.Second, msgs))
}

type lazyCount struct{ n *atomic.Int32 }

func (l lazyCount) String() string { return strconv.Itoa(int(l.n.Load())) }

// Once RabbitMQ has acked nothing for HoldAfter while publishes wait, a new
// message is not put on the connection: it is refused at once, unknown to
// nobody, so the loss of the connection cannot make it a second copy. The
// connection replaced, it goes once.
func TestQuietConnectionTakesNothingNew(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	var drop atomic.Bool
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		c.StallTimeout, c.HoldAfter = 3*time.Second, 500*time.Millisecond
		amqpsink.WrapConn(c, func(nc net.Conn) net.Conn {
			if conns.Add(1) == 1 {
				return dropWrites{Conn: nc, drop: &drop}
			}
			return nc
		})
	})
	first, later := sinktest.Messages("quiet-first", 10), sinktest.Messages("quiet-later", 10)
	drop.Store(true)
	sinktest.RequireAllUnavailable(t, first, sinktest.Publish(t, e.sink, 600*time.Millisecond, first))
	start := time.Now()
	results := sinktest.Publish(t, e.sink, 10*time.Second, later)
	if took := time.Since(start); took > time.Second {
		t.Errorf("the held-back publish took %v, want at once", took)
	}
	sinktest.RequireAllUnavailable(t, later, results)
	for i, err := range results {
		if !strings.Contains(err.Error(), "acked nothing for") {
			t.Fatalf("message %d: %v, want it held back as RabbitMQ acked nothing", i, err)
		}
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return conns.Load() == 2 && e.sink.Ready() == nil },
		"the sink did not connect again: %d connections", lazyCount{&conns})
	both := append(first, later...)
	sinktest.RequireAllNil(t, both, sinktest.Publish(t, e.sink, 15*time.Second, both))
	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), both, 1)
}
