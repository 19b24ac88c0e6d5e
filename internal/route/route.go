// Package route says where an outbox row goes: the RabbitMQ exchange and
// routing key, and the NATS subject and stream, chosen from the row's topic
// and headers by the first matching route of a routes file, or by the
// default route (the configured exchange, the topic as routing key, the
// subject prefix before the topic). See docs/routes.md.
package route

import (
	"regexp"
	"strings"
)

// Dest is where one message goes.
type Dest struct {
	Exchange   string // the AMQP exchange; "" is the default exchange (straight to the queue named by RoutingKey)
	RoutingKey string
	Subject    string // the NATS subject
	Stream     string // the stream that must store it (Nats-Expected-Stream); "": any stream that captures Subject
}

// Defaults are the default route's settings, from RELAY_AMQP_EXCHANGE,
// RELAY_NATS_SUBJECT_PREFIX and RELAY_NATS_STREAM.
type Defaults struct {
	Exchange      string
	SubjectPrefix string
	Stream        string
}

// Table is a list of routes tried in order, then the default route. It is
// read-only once built and safe for concurrent use.
type Table struct {
	routes []*Route
	def    Defaults
}

// Route is one entry of a routes file, parsed.
type Route struct {
	Name    string // the route's name, or "routes[i]"
	topic   pattern
	headers map[string]string // each must be equal to the row's

	exchange, routingKey, subject template
	stream                        string
	// reverse: the templates as matchers, for FromAMQP and FromSubject
	reverse struct{ exchange, routingKey, subject *regexp.Regexp }
}

// Default returns the table of the default route only: what relayd does
// without a routes file.
func Default(d Defaults) *Table { return &Table{def: d} }

// Routes are the table's routes, in the order they are tried (the default
// route is not among them).
func (t *Table) Routes() []*Route { return t.routes }

// Defaults are the default route's settings.
func (t *Table) Defaults() Defaults { return t.def }

// Resolve returns where a row of topic and headers goes, and the name of
// the route that chose it ("" for the default route).
func (t *Table) Resolve(topic string, headers map[string]string) (Dest, string) {
	var caps [maxCaptures]string
	for _, r := range t.routes {
		n, ok := r.topic.match(topic, &caps)
		if !ok || !r.headersMatch(headers) {
			continue
		}
		return Dest{
			Exchange:   r.exchange.render(topic, caps[:n]),
			RoutingKey: r.routingKey.render(topic, caps[:n]),
			Subject:    r.subject.render(topic, caps[:n]),
			Stream:     r.stream,
		}, r.Name
	}
	return Dest{Exchange: t.def.Exchange, RoutingKey: topic, Subject: t.def.SubjectPrefix + topic, Stream: t.def.Stream}, ""
}

func (r *Route) headersMatch(h map[string]string) bool {
	for k, v := range r.headers {
		if got, ok := h[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Exchange is the route's exchange: a name, or, when it has placeholders, a
// pattern in which each stands for any text (templated is true).
func (r *Route) Exchange() (name string, templated bool) {
	return r.exchange.pattern("*"), !r.exchange.literal()
}

// SubjectFilter is the NATS subject filter that captures every subject the
// route can give: each placeholder is a wildcard.
func (r *Route) SubjectFilter() string { return r.subject.filter(r.spans) }

// spans reports whether capture ref may hold dots: the topic, or the capture
// of a final ">".
func (r *Route) spans(ref int) bool {
	return ref == refTopic || (r.topic.tail && ref == r.topic.wildcards())
}

// Stream is the stream the route names, or "".
func (r *Route) Stream() string { return r.stream }

// String describes the route for logs and errors.
func (r *Route) String() string {
	var b strings.Builder
	b.WriteString(r.Name)
	b.WriteString(" (topic ")
	b.WriteString(r.topic.String())
	b.WriteString(")")
	return b.String()
}

// Spec is a route as its file gives it, defaults filled in: for listings.
type Spec struct {
	Name       string            `json:"name"`
	Topic      string            `json:"topic"`
	Headers    map[string]string `json:"headers,omitempty"`
	Exchange   string            `json:"exchange"`
	RoutingKey string            `json:"routing_key"`
	Subject    string            `json:"subject"`
	Stream     string            `json:"stream"`
}

// Spec is r as its file gives it.
func (r *Route) Spec() Spec {
	return Spec{Name: r.Name, Topic: r.topic.String(), Headers: r.headers, Exchange: r.exchange.String(),
		RoutingKey: r.routingKey.String(), Subject: r.subject.String(), Stream: r.stream}
}

// DefaultSpec is the default route as a Spec.
func (t *Table) DefaultSpec() Spec {
	return Spec{Name: "(default)", Topic: ">", Exchange: t.def.Exchange, RoutingKey: "{topic}",
		Subject: t.def.SubjectPrefix + "{topic}", Stream: t.def.Stream}
}
