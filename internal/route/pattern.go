package route

import (
	"fmt"
	"strings"
)

// maxCaptures bounds a topic pattern's wildcards.
const maxCaptures = 9

// pattern is a topic pattern: tokens separated by dots, NATS style; "*"
// matches one token and a final ">" one or more, each a capture ({1}, {2},
// … in order). The empty pattern matches every topic, capturing nothing.
type pattern struct {
	tokens []string
	tail   bool // the last token is ">"
}

func parsePattern(s string) (pattern, error) {
	if s == "" {
		return pattern{}, nil
	}
	p := pattern{tokens: strings.Split(s, ".")}
	wild := 0
	for i, tok := range p.tokens {
		switch {
		case tok == "":
			return pattern{}, fmt.Errorf("%q has an empty token", s)
		case strings.ContainsAny(tok, " \t\r\n"):
			return pattern{}, fmt.Errorf("%q contains whitespace", s)
		case tok == ">" && i != len(p.tokens)-1:
			return pattern{}, fmt.Errorf("%q: > must be the last token", s)
		case tok == "*" || tok == ">":
			wild++
		case strings.ContainsAny(tok, "*>"):
			return pattern{}, fmt.Errorf("%q: a wildcard must be a whole token", s)
		}
	}
	if wild > maxCaptures {
		return pattern{}, fmt.Errorf("%q has %d wildcards, at most %d", s, wild, maxCaptures)
	}
	if last := len(p.tokens) - 1; p.tokens[last] == ">" {
		p.tail, p.tokens = true, p.tokens[:last]
	}
	return p, nil
}

// wildcards is how many captures a match gives.
func (p pattern) wildcards() int {
	n := 0
	for _, t := range p.tokens {
		if t == "*" {
			n++
		}
	}
	if p.tail {
		n++
	}
	return n
}

// match reports whether topic matches p, its captures in caps[:n]:
// substrings of topic, nothing copied.
func (p pattern) match(topic string, caps *[maxCaptures]string) (n int, ok bool) {
	if p.tokens == nil && !p.tail {
		return 0, true
	}
	rest := topic
	for i, want := range p.tokens {
		if rest == "" && i > 0 {
			return 0, false
		}
		tok, after, more := strings.Cut(rest, ".")
		if tok == "" {
			return 0, false
		}
		switch {
		case want == "*":
			caps[n] = tok
			n++
		case want != tok:
			return 0, false
		}
		if !more {
			rest = ""
			if i != len(p.tokens)-1 || p.tail {
				return 0, false
			}
			return n, true
		}
		rest = after
	}
	if !p.tail {
		return 0, false // tokens left over
	}
	if rest == "" {
		return 0, false
	}
	caps[n] = rest
	return n + 1, true
}

func (p pattern) String() string {
	if p.tokens == nil && !p.tail {
		return "(any)"
	}
	s := strings.Join(p.tokens, ".")
	if p.tail {
		if s != "" {
			s += "."
		}
		s += ">"
	}
	return s
}
