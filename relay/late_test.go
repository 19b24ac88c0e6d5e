package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
)

// lateSink stands for a broker whose confirms outlive the publish timeout:
// every publish comes back "awaiting confirm", and the confirms come when
// the test says (confirmAll), through the LateConfirmer callback. After its
// first batch it reports itself down, so that its relay claims no more.
type lateSink struct {
	*fakeSink
	mu      sync.Mutex
	onLate  func(string)
	pending []string
	early   bool // confirm before Publish returns (before the batch records)
	// beforeEarly, when set, runs just before the early confirms.
	beforeEarly func()
}

func (s *lateSink) OnLateConfirm(f func(string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onLate = f
}

func (s *lateSink) Publish(_ context.Context, msgs []*Message, results []error) {
	s.mu.Lock()
	for i, m := range msgs {
		s.pending = append(s.pending, m.MessageID)
		results[i] = AwaitingConfirm(errors.New("test: no confirm yet"))
	}
	s.mu.Unlock()
	s.setDown(errors.New("test: stalled"))
	if s.early {
		if s.beforeEarly != nil {
			s.beforeEarly()
		}
		s.confirmAll()
	}
}

func (s *lateSink) confirmAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.pending {
		s.onLate(id)
	}
	s.pending = nil
}

// A confirm that comes after its batch gave up is recorded as a delivery at
// once, and the row is held back from a retry meanwhile: another instance
// never publishes it a second time. Dual write: the rows JetStream already
// has are done when RabbitMQ's late confirm is recorded. Early: the confirm
// comes before the batch that gave up has recorded its outcome.
func TestLateConfirmIsRecordedBeforeAnyRetry(t *testing.T) {
	t.Parallel()
	for _, early := range []bool{false, true} {
		t.Run(fmt.Sprintf("early=%v", early), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			stalled := &lateSink{fakeSink: newFake(TargetAMQP), early: early}
			f.start(Config{Sinks: []Sink{stalled, newFake(TargetNATS)}, Workers: 1, PublishTimeout: 2 * time.Second})
			ids := f.insert(50, "orders.created")
			// The stalled instance's batch is recorded: JetStream has the
			// rows, RabbitMQ's verdict is pending, and the retry waits at
			// least a publish timeout (early: or the rows are done
			// already).
			testenv.Eventually(t, 10*time.Second, func() bool {
				var held, done int
				f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.table.Owed()+`
					WHERE nats_delivered_at IS NOT NULL AND amqp_retry_at > now() + interval '1 second'`).Scan(&held)
				f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.table.Delivered()).Scan(&done)
				return held == len(ids) || early && held+done == len(ids)
			}, "the stalled batch was not recorded with its retry held back")
			other := newFake(TargetAMQP)
			otherNATS := newFake(TargetNATS)
			f.start(Config{Sinks: []Sink{other, otherNATS}, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
			if !early {
				time.Sleep(300 * time.Millisecond) // a retry without the hold-back is due by now
				stalled.confirmAll()
			}
			testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(ids) }, "late confirms not recorded")
			for _, id := range ids {
				if s := f.state(id); !s.amqpDelivered || !s.natsDelivered {
					t.Fatalf("row %s: %+v, want delivered to both", id, s)
				}
			}
			if n, m := other.total(), otherNATS.total(); n != 0 || m != 0 {
				t.Fatalf("the other instance published %d rows to RabbitMQ and %d to JetStream again, want none", n, m)
			}
		})
	}
}

// Late confirms that came while the relay was stopping are recorded before
// Run returns: the relay is told to stop, then the confirms come, during its
// last batch.
func TestLateConfirmsAtStopAreRecorded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	stalled := &lateSink{fakeSink: newFake(TargetAMQP), early: true}
	var cancel context.CancelFunc
	stalled.beforeEarly = func() {
		cancel()
		time.Sleep(100 * time.Millisecond) // the relay has seen it
	}
	_, cancel, done := f.start(Config{Sinks: []Sink{stalled}, Workers: 1})
	ids := f.insert(20, "orders.created") // after cancel is set: no batch before
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if n := f.countDone(); n != len(ids) {
		t.Fatalf("%d of %d rows recorded delivered when Run returned", n, len(ids))
	}
}

// A record of late confirms under way when the relay stops (here waiting
// for a row another transaction holds, as for a Postgres that does not
// answer) gets lateStopGrace more, not its whole limit: Run returns within
// seconds, not past RELAY_SHUTDOWN_TIMEOUT.
func TestStopCutsShortALateRecordUnderWay(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := f.insert(1, "orders.created")
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only held
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+f.table.Ident()+` WHERE message_id = @message_id FOR UPDATE`, pgx.NamedArgs{"message_id": ids[0]}); err != nil {
		t.Fatal(err)
	}
	r, cancel, done := f.start(Config{Sinks: []Sink{newFake(TargetAMQP)}, Workers: 1})
	r.onLateConfirm(TargetAMQP)(ids[0])
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int
		err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || @schema || '%'`,
			pgx.NamedArgs{"schema": f.table.Schema}).Scan(&n)
		return err == nil && n > 0
	}, "the late record never waited for the row")
	start := time.Now()
	cancel()
	select {
	case <-done:
	case <-time.After(lateStopGrace + 10*time.Second):
		t.Fatalf("Run did not return within %v of the stop: the late record held it", lateStopGrace+10*time.Second)
	}
	if took := time.Since(start); took < lateStopGrace-time.Second {
		t.Errorf("Run returned after %v: the late record was not given its grace", took)
	}
}

// Late confirms that move rows from the outbox to the owed table announce
// the lowest of them to every relay: another relay's owed floors may have
// passed them. The notification comes with the commit.
func TestLateConfirmsAnnounceTheRowsTheyMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	msgs := f.insert(3, "orders.created")
	keys, err := readWakeKeys(ctx, f.pool, f.table)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, outboxsql.Listen(keys.channel)); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `UNLISTEN *`) //nolint:errcheck // the pool's connection, for the next user
	var low int64
	if err := f.pool.QueryRow(ctx, `SELECT min(id) FROM `+f.table.Ident()+` WHERE message_id = ANY(@m::uuid[])`,
		pgx.NamedArgs{"m": msgs[1:]}).Scan(&low); err != nil {
		t.Fatal(err)
	}
	_, moved, err := newStore(f.table).recordLate(ctx, f.pool, TargetAMQP, msgs[1:], dualWrite, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if moved != low {
		t.Fatalf("recordLate moved from row %d, want %d", moved, low)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wctx)
	if err != nil {
		t.Fatalf("no notification after the late confirms moved rows: %v", err)
	}
	if got := putBackIn(n.Payload); got != low {
		t.Fatalf("notification payload %q: want the lowest row moved, %d", n.Payload, low)
	}
}
