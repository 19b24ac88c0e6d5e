package main

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// scrubMax bounds a text the console shows, in bytes.
const scrubMax = 1000

// keyBefore are the words after which relayd's reasons quote a header's key
// (headers.AMQPReason, NATSKeyReason), which the console may show.
var keyBefore = []string{"key ", "value of "}

// scrub is a reason or an error made fit for the console, which never shows
// a header's value or a password: every quoted string but a header's key is
// masked, for relayd's reasons quote the value they refuse
// (headers.AMQPProperty.Reason, amqpsink's userIDReason) and a broker's
// error may quote what it refused; a URL's password is masked as in the logs.
func scrub(s string) string {
	if len(s) > scrubMax {
		cut := scrubMax
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		c := s[i]
		if c != '"' && c != '\'' {
			b.WriteByte(c)
			i++
			continue
		}
		if c == '\'' && i > 0 {
			// An apostrophe (RabbitMQ's) opens nothing.
			if r, _ := utf8.DecodeLastRuneInString(s[:i]); unicode.IsLetter(r) || unicode.IsDigit(r) {
				b.WriteByte(c)
				i++
				continue
			}
		}
		end := quoteEnd(s, i)
		if end < 0 {
			b.WriteString(string(c) + "…")
			break
		}
		if c == '"' && endsWithAny(b.String(), keyBefore) {
			b.WriteString(s[i:end])
		} else {
			b.WriteString(string(c) + "…" + string(c))
		}
		i = end
	}
	return urlInText.ReplaceAllStringFunc(b.String(), redactURL)
}

// quoteEnd is the index past the quote that closes the one at s[i], or -1.
// A Go-quoted string ("…") escapes its quotes with '\'.
func quoteEnd(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case q == '"' && s[j] == '\\':
			j++
		case s[j] == q:
			return j + 1
		}
	}
	return -1
}

func endsWithAny(s string, suffixes []string) bool {
	for _, x := range suffixes {
		if strings.HasSuffix(s, x) {
			return true
		}
	}
	return false
}

// urlInText is a URL within a message, up to the next space.
var urlInText = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://\S+`)
