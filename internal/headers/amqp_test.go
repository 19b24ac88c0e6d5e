package headers

import (
	"strings"
	"testing"
)

func TestAMQPPropertyIndex(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   string // the property, "" for none
	}{
		{"content-type", "content-type"},
		{"Content-Type", "content-type"},
		{"CONTENT-TYPE", "content-type"},
		{"Correlation-Id", "correlation-id"},
		{"reply-to", "reply-to"},
		{"Type", "type"},
		{"user-id", "user-id"},
		{"App-Id", "app-id"},
		{"Priority", "priority"},
		{"expiration", "expiration"},
		{"content-encoding", "content-encoding"},
		// The relay's own, and delivery-mode (always persistent): headers.
		{"message-id", ""},
		{"Message-Id", ""},
		{"timestamp", ""},
		{"delivery-mode", ""},
		{"content_type", ""},
		{"x-type", ""},
		{"types", ""},
		{"uſer-id", ""}, // EqualFold's: U+017F folds to 's'; not AMQP's
	} {
		i := AMQPPropertyIndex(tc.header)
		got := ""
		if i >= 0 {
			got = AMQPProperties[i].Header
		}
		if got != tc.want || IsAMQPProperty(tc.header) != (tc.want != "") {
			t.Errorf("%q sets %q (IsAMQPProperty %v), want %q", tc.header, got, IsAMQPProperty(tc.header), tc.want)
		}
	}
}

// Every name is AMQP's lower-case spelling, once.
func TestAMQPPropertiesAreCanonical(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range AMQPProperties {
		if p.Header != strings.ToLower(p.Header) || seen[p.Header] || p.Field == "" {
			t.Errorf("property %+v: want a lower-case name, once, and a field", p)
		}
		seen[p.Header] = true
	}
}

func TestAMQPReason(t *testing.T) {
	long := strings.Repeat("a", 256)
	for _, tc := range []struct {
		k, v string
		ok   bool
	}{
		{"content-type", "application/json", true},
		{"Content-Type", long, false},
		{"CORRELATION-ID", long, false},
		{"type", strings.Repeat("a", 255), true},
		{"app-id", long, false},
		{"x-note", long, true}, // a long string in the table
		{long, "v", false},     // a key is a short string
		{"priority", "0", true},
		{"priority", "255", true},
		{"Priority", "007", true},
		{"priority", "256", false},
		{"priority", "-1", false},
		{"priority", "+1", false},
		{"priority", " 1", false},
		{"priority", "high", false},
		{"priority", "", true}, // empty: none
		{"expiration", "60000", true},
		{"expiration", "0", true},
		{"expiration", "4294967295", true},
		{"expiration", "4294967296", false},
		{"Expiration", "-1", false},
		{"expiration", "1.5", false},
		{"expiration", "60s", false},
		{"expiration", "+5", false},
		{"expiration", "", true},
		{"message-id", long, true}, // not a property: a long string
		{"timestamp", "yesterday", true},
	} {
		if got := AMQPReason(tc.k, tc.v); (got == "") != tc.ok {
			t.Errorf("AMQPReason(%.30q, %.30q) = %q, want ok %v", tc.k, tc.v, got, tc.ok)
		}
	}
}
