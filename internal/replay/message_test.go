package replay

import (
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
)

// asNATS builds the JetStream message the relay's nats target publishes for
// m (relay/natssink): the headers, then Nats-Msg-Id and Nats-Expected-Stream.
func asNATS(prefix string, m *relay.Message) *nats.Msg {
	msg := &nats.Msg{Subject: prefix + m.Topic, Data: m.Payload, Header: nats.Header{}}
	for k, v := range m.Headers {
		msg.Header[k] = []string{v}
	}
	msg.Header[jetstream.MsgIDHeader] = []string{m.MessageID}
	msg.Header[jetstream.ExpectedStreamHeader] = []string{"OUTBOX"}
	return msg
}

func TestToAMQP(t *testing.T) {
	stored := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	row := &relay.Message{MessageID: "6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b10", Topic: "orders.placed",
		Headers: map[string]string{"content-type": "application/json", "Correlation-Id": "c-1", "tenant": "acme",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		Payload: []byte(`{"n":1}`)}
	bare := &relay.Message{MessageID: "legacy-000001", Topic: "test.x", Payload: []byte("x")}
	noID := asNATS("outbox.", bare)
	delete(noID.Header, jetstream.MsgIDHeader)
	for _, tc := range []struct {
		name     string
		msg      *nats.Msg
		prefix   string
		want     *relay.Message
		wantSkip skip
	}{
		{"a relayed row: its id, topic and headers, no Nats-* ones", asNATS("outbox.", row), "outbox.", row, send},
		{"no headers but the id", asNATS("outbox.", bare), "outbox.", bare, send},
		{"empty prefix", asNATS("", row), "", row, send},
		{"without Nats-Msg-Id", noID, "outbox.", nil, skipWithoutID},
		{"outside the prefix", asNATS("other.", row), "outbox.", nil, skipOtherSubject},
		{"the prefix alone is no topic", &nats.Msg{Subject: "outbox.", Header: nats.Header{jetstream.MsgIDHeader: {"x"}}}, "outbox.", nil, skipOtherSubject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := toAMQP(tc.msg.Subject, tc.msg.Header, tc.msg.Data, stored, route.Default(route.Defaults{Exchange: "outbox", SubjectPrefix: tc.prefix}))
			if why != tc.wantSkip {
				t.Fatalf("skip %q, want %q", why, tc.wantSkip)
			}
			if tc.want == nil {
				if got != nil {
					t.Fatalf("got a message for a skipped one: %+v", got)
				}
				return
			}
			if got.MessageID != tc.want.MessageID || got.Topic != tc.want.Topic || string(got.Payload) != string(tc.want.Payload) ||
				!maps.Equal(got.Headers, tc.want.Headers) || !got.CreatedAt.Equal(stored) {
				t.Errorf("toAMQP:\n got %+v\nwant %+v (created at %s)", got, tc.want, stored)
			}
		})
	}
}

// The replayed message is what the relay's RabbitMQ target would have
// published for the row: the same AMQP properties and headers table. A
// header naming a property (type, content-type, ...) comes back as that
// property alone, as the relay published it during dual write.
func TestReplayedPublishingIsTheRelays(t *testing.T) {
	stored := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		check   func(p amqp.Publishing) bool // what this case is about
	}{
		{"content-type and correlation-id", map[string]string{"content-type": "application/json", "correlation-id": "c-1", "tenant": "acme"},
			func(p amqp.Publishing) bool {
				return p.ContentType == "application/json" && p.CorrelationId == "c-1" && len(p.Headers) == 1
			}},
		{"type X: property type X, no type header", map[string]string{"type": "X"},
			func(p amqp.Publishing) bool { return p.Type == "X" && p.Headers == nil }},
		{"every property, in any case", map[string]string{"Content-Type": "text/plain", "content-encoding": "gzip", "Reply-To": "r",
			"expiration": "60000", "priority": "9", "Type": "order.placed", "user-id": "shop", "app-id": "api", "x": "y"},
			func(p amqp.Publishing) bool { return p.Priority == 9 && p.UserId == "shop" && len(p.Headers) == 1 }},
		{"no headers", nil, func(p amqp.Publishing) bool { return p.Headers == nil && p.Type == "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row := &relay.Message{MessageID: "6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b10", Topic: "orders.placed",
				Headers: tc.headers, Payload: []byte(`{"n":1}`), CreatedAt: stored}
			n := asNATS("outbox.", row)
			got, _ := toAMQP(n.Subject, n.Header, n.Data, stored, route.Default(route.Defaults{Exchange: "outbox", SubjectPrefix: "outbox."}))
			a, b := amqpsink.Publishing(row), amqpsink.Publishing(got)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("replayed publishing differs from the relay's:\n got %+v\nwant %+v", b, a)
			}
			if !tc.check(b) {
				t.Errorf("replayed publishing %+v", b)
			}
		})
	}
}

// A rollback sends a message back where its route sent it: the topic from
// the subject, then the route's exchange and routing key.
func TestToAMQPByRoutes(t *testing.T) {
	routes, err := route.Parse([]byte(`routes:
  - topic: billing.*
    amqp: {exchange: "Billing.Contracts:{1}", routing_key: ""}
    nats: {subject: "billing.{1}", stream: BILLING}
  - topic: tasks.>
    amqp: {exchange: "", routing_key: celery}
`), route.Defaults{Exchange: "outbox", SubjectPrefix: "outbox.", Stream: "OUTBOX"})
	if err != nil {
		t.Fatal(err)
	}
	stored := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		subject string
		want    route.Dest // zero: skipped
		topic   string
	}{
		{"billing.InvoiceCreated", route.Dest{Exchange: "Billing.Contracts:InvoiceCreated", Subject: "billing.InvoiceCreated", Stream: "BILLING"}, "billing.InvoiceCreated"},
		{"outbox.tasks.send", route.Dest{Exchange: "", RoutingKey: "celery", Subject: "outbox.tasks.send", Stream: "OUTBOX"}, "tasks.send"},
		{"outbox.orders.created", route.Dest{Exchange: "outbox", RoutingKey: "orders.created", Subject: "outbox.orders.created", Stream: "OUTBOX"}, "orders.created"},
		{"outbox.billing.InvoiceCreated", route.Dest{}, ""}, // billing.* has its own subject: not the relay's
	} {
		n := &nats.Msg{Subject: tc.subject, Header: nats.Header{jetstream.MsgIDHeader: {"id-1"}}}
		got, why := toAMQP(n.Subject, n.Header, nil, stored, routes)
		switch {
		case tc.topic == "" && why != skipOtherSubject:
			t.Errorf("%s: skip %q, want %q", tc.subject, why, skipOtherSubject)
		case tc.topic != "" && (why != send || got.Topic != tc.topic || got.Route == nil || *got.Route != tc.want):
			t.Errorf("%s: %q, %+v; want topic %s by %+v", tc.subject, why, got, tc.topic, tc.want)
		}
	}
}
