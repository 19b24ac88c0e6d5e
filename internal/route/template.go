package route

import (
	"fmt"
	"strconv"
	"strings"
)

// template is a destination's text with placeholders: {topic}, the row's
// whole topic, and {1}…{9}, the topic pattern's captures in order.
type template struct {
	parts []part
}

// part is literal text (ref 0), the topic (ref -1) or capture ref.
type part struct {
	lit string
	ref int
}

const refTopic = -1

func parseTemplate(s string, captures int) (template, error) {
	var t template
	for s != "" {
		open := strings.IndexAny(s, "{}")
		if open < 0 {
			t.parts = append(t.parts, part{lit: s})
			break
		}
		if s[open] == '}' {
			return template{}, fmt.Errorf("a } without its {")
		}
		if open > 0 {
			t.parts = append(t.parts, part{lit: s[:open]})
		}
		end := strings.IndexByte(s[open:], '}')
		if end < 0 {
			return template{}, fmt.Errorf("a { without its }")
		}
		name := s[open+1 : open+end]
		switch n, err := strconv.Atoi(name); {
		case name == "topic":
			t.parts = append(t.parts, part{ref: refTopic})
		case err == nil && n >= 1 && n <= captures:
			t.parts = append(t.parts, part{ref: n})
		case err == nil:
			return template{}, fmt.Errorf("{%s}: the topic pattern has %d wildcard(s)", name, captures)
		default:
			return template{}, fmt.Errorf("{%s}: a placeholder is {topic} or {1}…{%d}, a capture of the topic pattern", name, maxCaptures)
		}
		s = s[open+end+1:]
	}
	return t, nil
}

// captures is what a route's destinations gave back (reverse.go).
type captures struct {
	topic string
	caps  []string
}

// render is the template with topic and caps in place. Resolve's caps stay
// on its stack: a captures value holding them would move them to the heap.
func (t template) render(topic string, caps []string) string {
	if len(t.parts) == 1 { // the common cases, without a copy
		switch p := t.parts[0]; p.ref {
		case 0:
			return p.lit
		case refTopic:
			return topic
		default:
			return caps[p.ref-1]
		}
	}
	n := 0
	for _, p := range t.parts {
		switch p.ref {
		case 0:
			n += len(p.lit)
		case refTopic:
			n += len(topic)
		default:
			n += len(caps[p.ref-1])
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range t.parts {
		switch p.ref {
		case 0:
			b.WriteString(p.lit)
		case refTopic:
			b.WriteString(topic)
		default:
			b.WriteString(caps[p.ref-1])
		}
	}
	return b.String()
}

// literal reports whether the template has no placeholder.
func (t template) literal() bool {
	for _, p := range t.parts {
		if p.ref != 0 {
			return false
		}
	}
	return true
}

// pattern renders the template with each placeholder as wild.
func (t template) pattern(wild string) string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.ref == 0 {
			b.WriteString(p.lit)
		} else {
			b.WriteString(wild)
		}
	}
	return b.String()
}

// filter is a NATS subject filter capturing every subject the template can
// give: a token holding a placeholder becomes "*", or ">" when a placeholder
// in it may span tokens ({topic}, the capture of a final ">"), which only
// the last token may hold (spans).
func (t template) filter(spans func(ref int) bool) string {
	var b strings.Builder
	for _, p := range t.parts {
		switch {
		case p.ref == 0:
			b.WriteString(p.lit)
		case spans(p.ref):
			b.WriteString("\x01")
		default:
			b.WriteString("\x00")
		}
	}
	toks := strings.Split(b.String(), ".")
	for i, tok := range toks {
		switch {
		case strings.Contains(tok, "\x01"):
			toks[i] = ">"
		case strings.Contains(tok, "\x00"):
			toks[i] = "*"
		}
	}
	return strings.Join(toks, ".")
}

// spanOK reports whether every placeholder that may span tokens is in the
// last token, as a subject needs (filter).
func (t template) spanOK(spans func(ref int) bool) bool {
	seenDot := false
	for i := len(t.parts) - 1; i >= 0; i-- {
		p := t.parts[i]
		if p.ref == 0 {
			seenDot = seenDot || strings.Contains(p.lit, ".")
			continue
		}
		if seenDot && spans(p.ref) {
			return false
		}
	}
	return true
}

func (t template) String() string {
	var b strings.Builder
	for _, p := range t.parts {
		switch p.ref {
		case 0:
			b.WriteString(p.lit)
		case refTopic:
			b.WriteString("{topic}")
		default:
			fmt.Fprintf(&b, "{%d}", p.ref)
		}
	}
	return b.String()
}
