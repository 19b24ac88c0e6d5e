package route

import (
	"regexp"
	"strings"
)

// The routes in reverse: which topic a message the legacy estate published
// (an exchange and routing key), or one the relay stored in JetStream (a
// subject), stands for. The backfill and replay find a message's topic so,
// and send it on by that topic's route: a message goes back where it came
// from, and the relay and the backfill give one message the same subject.

// FromAMQP returns the topic of a message published to exchange with
// routingKey (and headers, for routes that match on them): the topic whose
// route sends it there. ok is false when no route can have (a route whose
// exchange and key leave a wildcard of its topic unknown cannot answer).
func (t *Table) FromAMQP(exchange, routingKey string, headers map[string]string) (topic string, ok bool) {
	for _, r := range t.routes {
		c, ok := r.unrender([]template{r.exchange, r.routingKey}, []*regexp.Regexp{r.reverse.exchange, r.reverse.routingKey}, []string{exchange, routingKey})
		if !ok {
			continue
		}
		if topic, ok := r.topicOf(c); ok && t.routesTo(r, topic, headers) {
			return topic, true
		}
	}
	if exchange == t.def.Exchange && routingKey != "" {
		if _, name := t.Resolve(routingKey, headers); name == "" {
			return routingKey, true
		}
	}
	return "", false
}

// FromSubject returns the topic of a message JetStream holds on subject:
// the topic whose route gives that subject. ok is false when none can.
func (t *Table) FromSubject(subject string, headers map[string]string) (topic string, ok bool) {
	for _, r := range t.routes {
		c, ok := r.unrender([]template{r.subject}, []*regexp.Regexp{r.reverse.subject}, []string{subject})
		if !ok {
			continue
		}
		if topic, ok := r.topicOf(c); ok && t.routesTo(r, topic, headers) {
			return topic, true
		}
	}
	if topic, ok := strings.CutPrefix(subject, t.def.SubjectPrefix); ok && topic != "" {
		if _, name := t.Resolve(topic, headers); name == "" {
			return topic, true
		}
	}
	return "", false
}

// routesTo reports whether topic (with headers) goes by route r: an earlier
// route does not take it first.
func (t *Table) routesTo(r *Route, topic string, headers map[string]string) bool {
	_, name := t.Resolve(topic, headers)
	return name == r.Name
}

// unknown marks a capture no template gave.
const unknown = "\x00"

// unrender matches each of texts against its template (ts, as matchers
// res) and returns the topic and captures they give (unknown where none
// does); ok is false when a text does not match, or two places give one
// capture different values.
func (r *Route) unrender(ts []template, res []*regexp.Regexp, texts []string) (captures, bool) {
	c := captures{topic: unknown, caps: make([]string, r.topic.wildcards())}
	for i := range c.caps {
		c.caps[i] = unknown
	}
	for i, t := range ts {
		m := res[i].FindStringSubmatch(texts[i])
		if m == nil {
			return c, false
		}
		for j, p := range t.refs() {
			got, dst := m[j+1], &c.topic
			if p != refTopic {
				dst = &c.caps[p-1]
			}
			if *dst != unknown && *dst != got {
				return c, false
			}
			*dst = got
		}
	}
	return c, true
}

// topicOf is the topic that gives c: c's topic, or the route's topic
// pattern with its captures in place; ok is false when one is unknown.
func (r *Route) topicOf(c captures) (string, bool) {
	if c.topic != unknown {
		var caps [maxCaptures]string
		n, ok := r.topic.match(c.topic, &caps)
		for i := 0; ok && i < n; i++ {
			ok = c.caps[i] == unknown || c.caps[i] == caps[i]
		}
		return c.topic, ok
	}
	var b strings.Builder
	next := 0
	for i, tok := range r.topic.tokens {
		if i > 0 {
			b.WriteByte('.')
		}
		if tok == "*" {
			if c.caps[next] == unknown {
				return "", false
			}
			tok = c.caps[next]
			next++
		}
		b.WriteString(tok)
	}
	if r.topic.tail {
		if c.caps[next] == unknown {
			return "", false
		}
		if len(r.topic.tokens) > 0 {
			b.WriteByte('.')
		}
		b.WriteString(c.caps[next])
	}
	if r.topic.tokens == nil && !r.topic.tail {
		return "", false // a route on headers alone: its topic is not in its destinations
	}
	return b.String(), true
}

// refs are the template's placeholders in order.
func (t template) refs() []int {
	var out []int
	for _, p := range t.parts {
		if p.ref != 0 {
			out = append(out, p.ref)
		}
	}
	return out
}

// matcher is the template as an anchored expression, a group per
// placeholder: a capture of "*" is one token (no dot, not empty), the
// others any text but empty.
func (t template) matcher(spans func(ref int) bool) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for _, p := range t.parts {
		switch {
		case p.ref == 0:
			b.WriteString(regexp.QuoteMeta(p.lit))
		case spans(p.ref):
			b.WriteString("(.+)")
		default:
			b.WriteString("([^.]+)")
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}
