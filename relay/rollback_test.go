package relay_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/replay"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/natssink"
)

// A rollback out of nats against what finishes rows without RabbitMQ: the
// stranded-row cleanup and a batch claimed in nats. Whatever the order, the
// legacy queue gets each row once, from the relays in dual write or from
// replay.Run (relayd replay), on the real brokers.
func TestRollbackLosesNoRow(t *testing.T) {
	t.Parallel()
	t.Run("the cleanup holds the phase lock when the change comes", func(t *testing.T) {
		t.Parallel()
		e := newRollback(t)
		id := e.strandedRow()
		entered, release := make(chan struct{}), e.gate()
		var once sync.Once
		r := e.start(func(r *relay.Relay) {
			relay.SetFinishing(r, func() { once.Do(func() { close(entered); <-release }) })
		})
		e.waitRunning(r, relay.TargetNATS)
		cleaned := make(chan error, 1)
		go func() { cleaned <- r.CleanupOnce(context.Background()) }()
		e.await(entered, "the cleanup never reached its decision")

		changed := make(chan time.Time, 1)
		go func() { changed <- e.setPhase(phase.Dual) }()
		testenv.Eventually(t, 10*time.Second, e.changeWaits, "the change of phase never waited for the phase lock")
		select {
		case <-changed:
			t.Fatal("the change of phase committed while the cleanup held the phase lock")
		default:
		}
		e.open()
		if err := <-cleaned; err != nil {
			t.Fatal(err)
		}
		dualAt := <-changed
		done, amqpDone := e.delivered(id)
		if done.IsZero() || amqpDone || !done.Before(dualAt) {
			t.Fatalf("stranded row: done at %s (RabbitMQ has it: %v), change to dual at %s; want finished without RabbitMQ before the change",
				done, amqpDone, dualAt)
		}
		e.waitRunning(r, relay.TargetAMQP, relay.TargetNATS)
		e.replayEnds(id, 1) // the stranded row
	})

	t.Run("the change holds the phase lock when the cleanup comes", func(t *testing.T) {
		t.Parallel()
		e := newRollback(t)
		id := e.strandedRow()
		r := e.start(nil)
		e.waitRunning(r, relay.TargetNATS)
		// relayd phase set's statements, its commit held back.
		ctx := context.Background()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		q := outboxsql.For(e.table)
		if _, err := tx.Exec(ctx, q.PhaseLock); err != nil {
			t.Fatal(err)
		}
		set := outboxsql.PhaseSetParams{Phase: string(phase.Dual), ChangedBy: "test", Reason: "rollback"}
		if _, err := tx.Exec(ctx, q.PhaseSet, pgx.StrictStructArgs(set)); err != nil {
			t.Fatal(err)
		}
		if err := r.CleanupOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if done, _ := e.delivered(id); !done.IsZero() {
			t.Fatalf("the cleanup finished the stranded row at %s while a change out of nats was being recorded", done)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		e.waitRunning(r, relay.TargetAMQP, relay.TargetNATS)
		testenv.Eventually(t, 20*time.Second, func() bool { _, amqpDone := e.delivered(id); return amqpDone },
			"the relays in dual write never delivered the row RabbitMQ owed")
		e.replayEnds(id, 0) // the relays delivered the row
	})

	t.Run("a batch claimed in nats records after the change", func(t *testing.T) {
		t.Parallel()
		e := newRollback(t)
		published, release := make(chan struct{}), e.gate()
		var once sync.Once
		r := e.start(func(r *relay.Relay) {
			relay.SetAfterPublish(r, func() { once.Do(func() { close(published); <-release }) })
		})
		e.waitRunning(r, relay.TargetNATS)
		id := e.insert(1, "orders.rollback")[0]
		e.await(published, "no batch published the row")
		dualAt := e.setPhase(phase.Dual)
		e.open()
		testenv.Eventually(t, 20*time.Second, func() bool { done, _ := e.delivered(id); return !done.IsZero() },
			"the batch never recorded the row")
		if done, amqpDone := e.delivered(id); amqpDone || !done.After(dualAt) {
			t.Fatalf("row: done at %s (RabbitMQ has it: %v), change to dual at %s; want recorded under nats, after the change",
				done, amqpDone, dualAt)
		}
		e.waitRunning(r, relay.TargetAMQP, relay.TargetNATS)
		e.replayEnds(id, 1) // the row its batch finished without RabbitMQ
	})
}

// rollback is an outbox in phase nats after dual write, its stream, and a
// legacy exchange with one queue bound to every routing key.
type rollback struct {
	*relayFixture
	st              *testenv.Stream
	ch              *amqp.Channel
	exchange, queue string
	amqpSink        *amqpsink.Sink
	natsSink        *natssink.Sink

	release     chan struct{} // what a hook waits for; see gate
	releaseOnce sync.Once
}

func newRollback(t *testing.T) *rollback {
	t.Helper()
	e := &rollback{relayFixture: newRelayFixture(t), st: testenv.NewStream(t, "rollback"),
		exchange: testenv.Name("rollback"), queue: testenv.Name("rollback")}
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if e.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := e.ch.ExchangeDeclare(e.exchange, "topic", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ch.QueueDeclare(e.queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.ch.QueueBind(e.queue, "#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.ch.QueueDelete(e.queue, false, false, false) //nolint:errcheck // the test's own names
		e.ch.ExchangeDelete(e.exchange, false, false)  //nolint:errcheck // likewise
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e.amqpSink, err = amqpsink.New(ctx, amqpsink.Config{URL: testenv.AMQPURL(t), Exchange: e.exchange}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.amqpSink.Close() })
	if e.natsSink, err = natssink.New(natssink.Config{Conn: e.st.NC, Stream: e.st.Name, SubjectPrefix: e.st.Prefix, AckTimeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	e.setPhase(phase.Dual)
	e.setPhase(phase.NATS)
	return e
}

// start runs a relay that follows the table's phase until the test ends;
// prepare, when not nil, sets its hooks. A hook's gate opens before the
// relay stops.
func (e *rollback) start(prepare func(*relay.Relay)) *relay.Relay {
	e.t.Helper()
	var hooks []func(*relay.Relay)
	if prepare != nil {
		hooks = append(hooks, prepare)
	}
	r := e.relayFixture.start(relay.Config{Table: e.table, Sinks: []relay.Sink{e.amqpSink, e.natsSink},
		Phase: phase.Source{DB: e.pool, Table: e.table}, PhaseInterval: 20 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		PublishTimeout: 5 * time.Second, CleanupInterval: time.Hour}, hooks...)
	e.t.Cleanup(e.open)
	return r
}

// setPhase records the move to p from the phase the table has, as relayd
// phase set does (a move to nats is forced: no cutover check here), and
// returns its time.
func (e *rollback) setPhase(p phase.Name) time.Time {
	ctx := context.Background()
	before, set, err := phase.Read(ctx, e.pool, e.table)
	if err != nil {
		e.t.Error(err)
		return time.Time{}
	}
	at, err := phase.Set(ctx, e.pool, e.table, phase.Change{Phase: p, ChangedBy: "test", Forced: p == phase.NATS}, before, set)
	if err != nil {
		e.t.Error(err)
	}
	return at
}

// gate returns the channel a hook waits on until open; a test that fails
// before it opens it opens it as it ends, so nothing holds its connections.
func (e *rollback) gate() <-chan struct{} {
	e.release = make(chan struct{})
	e.t.Cleanup(e.open)
	return e.release
}

func (e *rollback) open() {
	if e.release != nil {
		e.releaseOnce.Do(func() { close(e.release) })
	}
}

// changeWaits reports whether a change of phase waits for the phase lock.
func (e *rollback) changeWaits() bool {
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = 0 AND objid = @phase_table::regclass::oid AND objsubid = 1`, pgx.NamedArgs{"phase_table": e.table.Side("phase")}).Scan(&n)
	return err == nil && n > 0
}

func (e *rollback) waitRunning(r *relay.Relay, want ...relay.Target) {
	e.t.Helper()
	testenv.Eventually(e.t, 10*time.Second, func() bool {
		got := r.Phase().Running
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if got[i] != want[i] {
				return false
			}
		}
		return true
	}, "the relay never ran %v", want)
}

func (e *rollback) await(c <-chan struct{}, msg string) {
	e.t.Helper()
	select {
	case <-c:
	case <-time.After(20 * time.Second):
		e.t.Fatal(msg)
	}
}

// strandedRow writes a row as a RabbitMQ outage during dual write leaves
// it: JetStream has it (10 minutes ago), RabbitMQ owes it, due now.
func (e *rollback) strandedRow() string {
	e.t.Helper()
	id := e.insert(1, "orders.rollback")[0]
	m := &nats.Msg{Subject: e.st.Prefix + "orders.rollback", Data: []byte("{}"), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
	if _, err := e.st.JS.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
	testenv.SetState(e.t, e.pool, e.table, `nats_delivered_at = now() - interval '10 minutes', amqp_attempts = 3,
		amqp_retry_at = now(), amqp_last_error = 'rabbitmq: connection refused'`, "message_id = @message_id", pgx.NamedArgs{"message_id": id})
	return id
}

// delivered reads the row's record in the delivered table: when it was
// done (zero: not there) and whether RabbitMQ has it.
func (e *rollback) delivered(id string) (done time.Time, amqpDone bool) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT done_at, amqp_delivered_at IS NOT NULL FROM `+e.table.Delivered()+
		` WHERE message_id = @message_id`, pgx.NamedArgs{"message_id": id}).Scan(&done, &amqpDone)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		e.t.Fatal(err)
	}
	return done, amqpDone
}

// replayEnds runs relayd replay's default window to the legacy exchange
// (replay.Run), wants it to send sent messages, and the legacy queue to hold
// id once and nothing else.
func (e *rollback) replayEnds(id string, sent int64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := replay.Run(ctx, replay.Config{DB: e.pool, Table: e.table, JS: e.st.JS, Stream: e.st.Name,
		SubjectPrefix: e.st.Prefix, Sink: e.amqpSink, Exchange: e.exchange, PublishTimeout: 5 * time.Second})
	if err != nil {
		e.t.Fatalf("replay: %v", err)
	}
	if sum.Sent != sent {
		e.t.Errorf("replay sent %d (window %s), want %d", sum.Sent, sum.Record.Request, sent)
	}
	e.wantQueue(id)
}

// wantQueue checks that the legacy queue holds id once and nothing else:
// every publish to it was confirmed by then, so it is all there.
func (e *rollback) wantQueue(id string) {
	e.t.Helper()
	got := map[string]int{}
	for {
		d, ok, err := e.ch.Get(e.queue, true)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			break
		}
		got[d.MessageId]++
	}
	if len(got) != 1 || got[id] != 1 {
		e.t.Errorf("legacy queue got %v, want %s once", got, id)
	}
}
