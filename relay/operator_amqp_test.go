package relay_test

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
)

// What an operator does to RabbitMQ while the relay runs parks no row: the
// relay says at once what is wrong, waits (an exchange missing or a
// permission refused pauses the target and uses up no attempt; a queue full
// with reject-publish nacks, an attempt each), and once the operator's next
// change fixes it, every row is in the queue once. Real Postgres and
// RabbitMQ (a user of the test's own for the permissions).
func TestOperatorChangesToRabbitMQParkNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		ownUser     bool       // the relay logs in as a user of the test's own
		queueArgs   amqp.Table // the bound queue's arguments
		broken, fix func(e *amqpOps)
		wantLog     string
		wantPause   bool // the target pauses, no attempt used; else each try is an attempt
	}{
		{
			name:      "the exchange deleted, then declared again",
			broken:    func(e *amqpOps) { e.check(e.ch.ExchangeDelete(e.exchange, false, false)) },
			fix:       func(e *amqpOps) { e.declare() },
			wantLog:   "NOT_FOUND - no exchange",
			wantPause: true,
		},
		{
			name:    "publish permission revoked on the vhost, then restored",
			ownUser: true,
			broken: func(e *amqpOps) {
				testenv.RabbitCtl(e.t, "set_permissions", "-p", "/", e.user, ".*", "^$", ".*")
				// Channels cache their permission checks: the revocation
				// holds from the relay's next connection.
				testenv.RabbitCtl(e.t, "close_all_user_connections", e.user, "permissions changed")
			},
			fix:       func(e *amqpOps) { testenv.RabbitCtl(e.t, "set_permissions", "-p", "/", e.user, ".*", ".*", ".*") },
			wantLog:   "ACCESS_REFUSED",
			wantPause: true,
		},
		{
			name:      "a queue full with reject-publish, then drained",
			queueArgs: amqp.Table{"x-max-length": int32(5), "x-overflow": "reject-publish"},
			broken:    func(*amqpOps) {},
			fix:       func(e *amqpOps) { e.drain() },
			wantLog:   "RabbitMQ nacked a message",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newRelayFixture(t)
			e := newAMQPOps(t, tc.ownUser, tc.queueArgs)
			var logged testenv.SyncBuffer
			sink, err := amqpsink.New(context.Background(), amqpsink.Config{URL: e.relayURL, Exchange: e.exchange,
				Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sink.Close() })
			r := f.start(relay.Config{Table: f.table, Sinks: []relay.Sink{sink}, MaxAttempts: 1000, PublishTimeout: 3 * time.Second,
				PollInterval: 20 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
			warm := f.insert(1, "orders.kept")
			testenv.Eventually(t, 10*time.Second, func() bool { return f.done(warm...) }, "the first row never reached RabbitMQ")

			tc.broken(e)
			ids := f.insert(50, "orders.moved")
			testenv.Eventually(t, 2*time.Second, func() bool { return strings.Contains(logged.String(), tc.wantLog) },
				"no log line saying %q within 2 s:\n%s", tc.wantLog, &logged)
			testenv.Eventually(t, 15*time.Second, func() bool {
				s := f.stats(relay.TargetAMQP)
				return s.Lag > 0 && s.Parked == 0 && f.tried("amqp", ids[len(ids)-1:]) && (!tc.wantPause || slices.Contains(r.Paused(), relay.TargetAMQP))
			}, "the lag never rose with the rows tried (or the target never paused): %+v, %q", f.stats(relay.TargetAMQP), r.Unready())
			if attempts := f.attempts("amqp", ids); tc.wantPause != (attempts == 0) {
				t.Errorf("rows' attempts meanwhile: %d, want them used: %v", attempts, !tc.wantPause)
			}

			tc.fix(e)
			testenv.Eventually(t, 30*time.Second, func() bool { return f.done(ids...) }, "the rows never reached RabbitMQ once it was fixed")
			if s := f.stats(relay.TargetAMQP); s.Parked != 0 {
				t.Errorf("%d rows parked", s.Parked)
			}
			got := e.queued(ids)
			for _, id := range ids {
				if got[id] != 1 {
					t.Fatalf("row %s is in the queue %d times, want once", id, got[id])
				}
			}
		})
	}
}

// amqpOps is what an operator does to one test's exchange and queue.
type amqpOps struct {
	t               *testing.T
	user            string // the relay's, when not guest
	adminURL        string
	relayURL        string
	conn            *amqp.Connection
	ch              *amqp.Channel // the operator's
	exchange, queue string
	queueArgs       amqp.Table

	mu       sync.Mutex
	consumed map[string]int // by drain's consumer, under mu
	done     chan struct{}  // closed when drain's consumer has ended
}

func newAMQPOps(t *testing.T, ownUser bool, queueArgs amqp.Table) *amqpOps {
	t.Helper()
	e := &amqpOps{t: t, adminURL: testenv.AMQPURL(t), exchange: testenv.Name("ops"), queue: testenv.Name("ops"), queueArgs: queueArgs}
	e.relayURL = e.adminURL
	if ownUser {
		e.user, e.relayURL = testenv.RabbitUser(t)
	}
	e.reconnect()
	if _, err := e.ch.QueueDeclare(e.queue, false, false, false, false, queueArgs); err != nil {
		t.Fatal(err)
	}
	e.declare()
	t.Cleanup(func() {
		e.conn.Close()
		if e.done != nil {
			<-e.done
		}
		e.reconnect()
		e.ch.QueueDelete(e.queue, false, false, false) //nolint:errcheck // the test's own names
		e.ch.ExchangeDelete(e.exchange, false, false)  //nolint:errcheck // likewise
		e.conn.Close()
	})
	return e
}

// reconnect opens the operator's connection.
func (e *amqpOps) reconnect() {
	e.t.Helper()
	conn, err := amqp.Dial(e.adminURL)
	if err != nil {
		e.t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	e.conn, e.ch = conn, ch
}

// declare declares the exchange and binds the queue to every routing key.
func (e *amqpOps) declare() {
	e.t.Helper()
	e.check(e.ch.ExchangeDeclare(e.exchange, "topic", false, false, false, false, nil))
	e.check(e.ch.QueueBind(e.queue, "#", e.exchange, false, nil))
}

// drain consumes the queue from now on, counting each message by id.
func (e *amqpOps) drain() {
	e.t.Helper()
	deliveries, err := e.ch.Consume(e.queue, "", true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.consumed, e.done = map[string]int{}, make(chan struct{})
	go func() {
		defer close(e.done)
		for d := range deliveries {
			e.mu.Lock()
			e.consumed[d.MessageId]++
			e.mu.Unlock()
		}
	}()
}

// queued counts by id what the queue got of ids: what the drain's consumer
// read (once it has them all), else what the queue holds.
func (e *amqpOps) queued(ids []string) map[string]int {
	e.t.Helper()
	got := map[string]int{}
	if e.done != nil {
		testenv.Eventually(e.t, 10*time.Second, func() bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			for _, id := range ids {
				if e.consumed[id] == 0 {
					return false
				}
			}
			return true
		}, "the consumer never read every row")
		e.mu.Lock()
		defer e.mu.Unlock()
		maps.Copy(got, e.consumed)
		return got
	}
	for {
		d, ok, err := e.ch.Get(e.queue, true)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			return got
		}
		got[d.MessageId]++
	}
}

func (e *amqpOps) check(err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
}
