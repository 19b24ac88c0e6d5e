package relay

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/internal/testenv"
)

// routesOf parses a routes file for a test; the defaults are the sinks'.
func routesOf(t *testing.T, file string) *route.Table {
	t.Helper()
	tab, err := route.Parse([]byte(file), route.Defaults{Exchange: "outbox", SubjectPrefix: "outbox.", Stream: "OUTBOX"})
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// seenRoutes records the route of each message a fake sink is given.
type seenRoutes struct {
	mu  sync.Mutex
	got map[string][]route.Dest
}

func (s *seenRoutes) record(m *Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got == nil {
		s.got = map[string][]route.Dest{}
	}
	if m.Route != nil {
		s.got[m.MessageID] = append(s.got[m.MessageID], *m.Route)
	}
}

func (s *seenRoutes) of(id string) []route.Dest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]route.Dest(nil), s.got[id]...)
}

// The owed row's route outlives the routes: RabbitMQ takes a row by the
// first relay's routes while JetStream is out; a relay with other routes
// sends it to JetStream by the same route, and a new row by its own.
func TestOwedRowsKeepTheirFirstRoute(t *testing.T) {
	t.Parallel()
	f := setup(t)
	v1 := routesOf(t, "routes:\n  - topic: audit.*\n    amqp: {exchange: old}\n    nats: {subject: 'old.{1}', stream: OLD}\n")
	v2 := routesOf(t, "routes:\n  - topic: audit.*\n    amqp: {exchange: new}\n    nats: {subject: 'new.{1}'}\n")
	want1 := route.Dest{Exchange: "old", RoutingKey: "audit.login", Subject: "old.login", Stream: "OLD"}
	want2 := route.Dest{Exchange: "new", RoutingKey: "audit.login", Subject: "new.login", Stream: "OUTBOX"}

	var amqpSaw, natsSaw seenRoutes
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	a.setFail(func(m *Message) error { amqpSaw.record(m); return nil })
	n.setFail(func(m *Message) error { natsSaw.record(m); return NoDestination(context.DeadlineExceeded) })
	_, cancel, done := f.start(Config{Sinks: []Sink{a, n}, Workers: 1, Routes: v1})
	first := f.insert(1, "audit.login")[0]
	testenv.Eventually(t, 10*time.Second, func() bool {
		s := f.state(first)
		return s.amqpDelivered && !s.natsDelivered && s.natsErr != ""
	}, "the row is not delivered to RabbitMQ and owed to JetStream")
	cancel()
	<-done

	n.setFail(func(m *Message) error { natsSaw.record(m); return nil })
	f.start(Config{Sinks: []Sink{a, n}, Workers: 1, Routes: v2})
	second := f.insert(1, "audit.login")[0]
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == 2 }, "rows not delivered")

	for _, tc := range []struct {
		what string
		got  []route.Dest
		want route.Dest
	}{
		{"the first row, to RabbitMQ", amqpSaw.of(first), want1},
		{"the first row, to JetStream", natsSaw.of(first), want1},
		{"the second row, to RabbitMQ", amqpSaw.of(second), want2},
		{"the second row, to JetStream", natsSaw.of(second), want2},
	} {
		for _, got := range tc.got {
			if got != tc.want {
				t.Errorf("%s: by %+v, want %+v", tc.what, got, tc.want)
			}
		}
		if len(tc.got) == 0 {
			t.Errorf("%s: never published", tc.what)
		}
	}
}

// A row a late confirm moves to the owed table gets the route of the relay
// that published it, so that the other broker gets it by the same route.
func TestLateConfirmRecordsTheRoute(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	n.setDown(Unavailable(context.DeadlineExceeded)) // nothing claimed meanwhile
	r, _, _ := f.start(Config{Sinks: []Sink{a, n}, Workers: 1,
		Routes: routesOf(t, "routes:\n  - topic: audit.*\n    amqp: {exchange: x, routing_key: k}\n    nats: {subject: 's.{1}', stream: S}\n")})
	id := f.insert(1, "audit.login")[0]
	r.onLateConfirm(TargetAMQP)(id)
	var got route.Dest
	testenv.Eventually(t, 10*time.Second, func() bool {
		err := f.pool.QueryRow(context.Background(), `SELECT amqp_exchange, amqp_routing_key, nats_subject, nats_stream
			FROM `+f.table.Owed()+` WHERE message_id = @message_id AND nats_subject IS NOT NULL`, pgx.NamedArgs{"message_id": id}).
			Scan(&got.Exchange, &got.RoutingKey, &got.Subject, &got.Stream)
		return err == nil
	}, "the late-confirmed row has no route in the owed table")
	if want := (route.Dest{Exchange: "x", RoutingKey: "k", Subject: "s.login", Stream: "S"}); got != want {
		t.Errorf("route %+v, want %+v", got, want)
	}
}
