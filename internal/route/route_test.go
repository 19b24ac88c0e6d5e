package route

import (
	"strings"
	"testing"
)

var defaults = Defaults{Exchange: "outbox", SubjectPrefix: "outbox.", Stream: "OUTBOX"}

const estate = `
routes:
  # MassTransit: a fanout exchange per message type.
  - name: billing-events
    topic: billing.*
    amqp: {exchange: "Billing.Contracts:{1}", routing_key: ""}
    nats: {subject: "billing.{1}", stream: BILLING}
  # Spring: a topic exchange per domain, the rest of the topic as the key.
  - topic: shipping.>
    amqp: {exchange: shipping, routing_key: "{1}"}
    nats: {subject: "ship.{1}"}
  # Celery: straight to a queue through the default exchange.
  - name: tasks
    topic: tasks.send
    headers: {x-legacy: celery}
    amqp: {exchange: "", routing_key: celery}
  - name: any-legacy
    headers: {x-legacy: "yes"}
    amqp: {exchange: legacy}
`

func TestResolve(t *testing.T) {
	tab, err := Parse([]byte(estate), defaults)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		topic   string
		headers map[string]string
		want    Dest
		route   string
	}{
		{"billing.InvoiceCreated", nil, Dest{"Billing.Contracts:InvoiceCreated", "", "billing.InvoiceCreated", "BILLING"}, "billing-events"},
		{"billing.a.b", nil, Dest{"outbox", "billing.a.b", "outbox.billing.a.b", "OUTBOX"}, ""},
		{"billing", nil, Dest{"outbox", "billing", "outbox.billing", "OUTBOX"}, ""},
		{"shipping.label.printed", nil, Dest{"shipping", "label.printed", "ship.label.printed", "OUTBOX"}, "routes[1]"},
		{"shipping", nil, Dest{"outbox", "shipping", "outbox.shipping", "OUTBOX"}, ""},
		{"tasks.send", map[string]string{"x-legacy": "celery"}, Dest{"", "celery", "outbox.tasks.send", "OUTBOX"}, "tasks"},
		{"tasks.send", map[string]string{"x-legacy": "no"}, Dest{"outbox", "tasks.send", "outbox.tasks.send", "OUTBOX"}, ""},
		{"tasks.send", nil, Dest{"outbox", "tasks.send", "outbox.tasks.send", "OUTBOX"}, ""},
		{"orders.created", map[string]string{"x-legacy": "yes"}, Dest{"legacy", "orders.created", "outbox.orders.created", "OUTBOX"}, "any-legacy"},
	} {
		got, route := tab.Resolve(tc.topic, tc.headers)
		if got != tc.want || route != tc.route {
			t.Errorf("Resolve(%q, %v) = %+v by %q, want %+v by %q", tc.topic, tc.headers, got, route, tc.want, tc.route)
		}
	}
}

func TestDefaultIsTodaysRoute(t *testing.T) {
	got, route := Default(defaults).Resolve("orders.created", map[string]string{"a": "b"})
	want := Dest{Exchange: "outbox", RoutingKey: "orders.created", Subject: "outbox.orders.created", Stream: "OUTBOX"}
	if got != want || route != "" {
		t.Fatalf("got %+v by %q, want %+v", got, route, want)
	}
}

func TestPatternMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, topic string
		caps           []string // nil: no match
	}{
		{"a.b", "a.b", []string{}},
		{"a.b", "a.b.c", nil},
		{"a.b", "a", nil},
		{"a.*", "a.b", []string{"b"}},
		{"a.*", "a.b.c", nil},
		{"*.*", "x.y", []string{"x", "y"}},
		{"a.>", "a.b.c", []string{"b.c"}},
		{"a.>", "a", nil},
		{">", "a.b", []string{"a.b"}},
		{"*.b.>", "x.b.y.z", []string{"x", "y.z"}},
		{"*.b.>", "x.c.y", nil},
		{"", "anything.at.all", []string{}},
	} {
		p, err := parsePattern(tc.pattern)
		if err != nil {
			t.Fatalf("%q: %v", tc.pattern, err)
		}
		var caps [maxCaptures]string
		n, ok := p.match(tc.topic, &caps)
		switch {
		case ok != (tc.caps != nil):
			t.Errorf("%q ~ %q: match %v, want %v", tc.pattern, tc.topic, ok, tc.caps != nil)
		case ok && strings.Join(caps[:n], "|") != strings.Join(tc.caps, "|"):
			t.Errorf("%q ~ %q: captures %q, want %q", tc.pattern, tc.topic, caps[:n], tc.caps)
		}
	}
}

func TestSubjectFilter(t *testing.T) {
	tab, err := Parse([]byte(estate), defaults)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"billing.*", "ship.>", "outbox.>", "outbox.>"}
	for i, r := range tab.Routes() {
		if got := r.SubjectFilter(); got != want[i] {
			t.Errorf("%s: filter %q, want %q", r, got, want[i])
		}
	}
	if name, templated := tab.Routes()[0].Exchange(); name != "Billing.Contracts:*" || !templated {
		t.Errorf("exchange %q templated %v", name, templated)
	}
}

// Each mistake is refused when the file is read, naming the route and field.
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"routes: [{topic: a.*, amqp: {exchange: x, routing_key: '{2}'}}]", "routes[0]: amqp.routing_key \"{2}\": {2}: the topic pattern has 1 wildcard(s)"},
		{"routes: [{name: inv, topic: a, nats: {subject: 'x.{who}'}}]", "routes[0] (inv): nats.subject \"x.{who}\": {who}: a placeholder"},
		{"routes: [{topic: a, amqp: {exchange: '', routing_key: ''}}]", "the default exchange"},
		{"routes: [{topic: a.>, nats: {subject: '{1}.x'}}]", "only the subject's last token"},
		{"routes: [{topic: a, nats: {subject: 'x.*'}}]", "no whitespace or wildcard"},
		{"routes: [{topic: 'a.>.b'}]", "> must be the last token"},
		{"routes: [{topic: 'a.b*'}]", "a wildcard must be a whole token"},
		{"routes: [{topic: a, nats: {stream: 'A.B'}}]", "not a valid stream name"},
		{"routes: [{amqp: {exchange: x}}]", "matches every row"},
		{"routes: [{topic: a, amqp: {exchnage: x}}]", "unknown field"},
		{"routes: [{name: x, topic: a}, {name: x, topic: b}]", "the name \"x\" is taken"},
		{"routes: [{topic: a, amqp: {exchange: 'x{'}}]", "a { without its }"},
	} {
		_, err := Parse([]byte(tc.file), defaults)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.file, err, tc.want)
		}
	}
}

func BenchmarkResolve(b *testing.B) {
	tab, err := Parse([]byte(estate), defaults)
	if err != nil {
		b.Fatal(err)
	}
	h := map[string]string{"content-type": "application/json"}
	for b.Loop() {
		tab.Resolve("shipping.label.printed", h)
	}
}

// The routes in reverse give back the topic a route sent: where the
// destinations hold every wildcard of the topic; else no answer, not a
// wrong one.
func TestReverse(t *testing.T) {
	tab, err := Parse([]byte(estate), defaults)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		topic   string
		headers map[string]string
		ok      bool // the exchange and key give the topic back
	}{
		{"billing.InvoiceCreated", nil, true},
		{"shipping.label.printed", nil, true},
		{"orders.created", nil, true},                                  // the default route
		{"billing.a.b", nil, true},                                     // the default route: billing.* takes one token
		{"tasks.send", map[string]string{"x-legacy": "celery"}, true},  // the topic has no wildcard
		{"orders.created", map[string]string{"x-legacy": "yes"}, true}, // routing key {topic}
	} {
		d, _ := tab.Resolve(tc.topic, tc.headers)
		topic, ok := tab.FromAMQP(d.Exchange, d.RoutingKey, tc.headers)
		if ok != tc.ok || ok && topic != tc.topic {
			t.Errorf("FromAMQP(%q, %q) = %q, %v; want %q, %v", d.Exchange, d.RoutingKey, topic, ok, tc.topic, tc.ok)
		}
		if topic, ok = tab.FromSubject(d.Subject, tc.headers); !ok || topic != tc.topic {
			t.Errorf("FromSubject(%q) = %q, %v; want %q", d.Subject, topic, ok, tc.topic)
		}
	}
	for _, tc := range []struct {
		exchange, key string
		headers       map[string]string
	}{
		{"Billing.Contracts:InvoiceCreated", "x", nil}, // the route's key is ""
		{"shipping", "", nil},
		{"unknown", "orders.created", nil},
		{"outbox", "shipping.label", nil}, // shipping.> goes to exchange shipping, not the default one
	} {
		if topic, ok := tab.FromAMQP(tc.exchange, tc.key, tc.headers); ok {
			t.Errorf("FromAMQP(%q, %q) = %q: no route sends there", tc.exchange, tc.key, topic)
		}
	}
	for _, subject := range []string{"billing.a.b", "ship", "elsewhere.x", "outbox.shipping.x"} {
		if topic, ok := tab.FromSubject(subject, nil); ok {
			t.Errorf("FromSubject(%q) = %q: no route gives it", subject, topic)
		}
	}
	// A queue's name holds none of the topic's wildcard: no answer.
	jobs, err := Parse([]byte("routes: [{topic: jobs.*, amqp: {exchange: '', routing_key: jobs}}]"), defaults)
	if err != nil {
		t.Fatal(err)
	}
	if topic, ok := jobs.FromAMQP("", "jobs", nil); ok {
		t.Errorf("FromAMQP(\"\", jobs) = %q: the route's key holds none of jobs.*", topic)
	}
	if topic, ok := jobs.FromSubject("outbox.jobs.run", nil); !ok || topic != "jobs.run" {
		t.Errorf("FromSubject(outbox.jobs.run) = %q, %v: the default subject holds the topic", topic, ok)
	}
}
