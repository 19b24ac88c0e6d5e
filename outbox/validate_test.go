package outbox

import (
	"errors"
	"strings"
	"testing"
	"unicode"

	"github.com/relayd/relayd/schema"
)

func TestNew(t *testing.T) {
	t.Parallel()
	w, err := New(Config{})
	if err != nil || w.table != (schema.Table{Name: "outbox"}) || w.maxPayload != 0 {
		t.Fatalf("New(Config{}) = %+v, %v; want table outbox, no payload limit", w, err)
	}
	w, err = New(Config{Table: "app.events", MaxPayload: 1024})
	if err != nil || w.table != (schema.Table{Schema: "app", Name: "events"}) || w.maxPayload != 1024 {
		t.Fatalf("New(app.events, 1024) = %+v, %v", w, err)
	}
	if _, err := New(Config{Table: "Outbox; DROP TABLE x"}); !errors.Is(err, schema.ErrInvalidTable) {
		t.Fatalf("New(bad table) = %v; want ErrInvalidTable", err)
	}
	if _, err := New(Config{MaxPayload: -1}); err == nil {
		t.Fatal("New(MaxPayload -1) succeeded; want an error")
	}
}

func TestValidateTopic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		topic string
		ok    bool
	}{
		{"orders", true},
		{"orders.created", true},
		{"orders.eu-west.v1", true},
		{"$sys_like.ok", true},
		{"заказы.создан", true},
		{strings.Repeat("a", 255), true},
		{"", false},
		{strings.Repeat("a", 256), false},
		{"orders created", false},
		{"orders\tcreated", false},
		{"orders\ncreated", false},
		{"orders\u00a0created", false}, // no-break space
		{"orders\x00", false},
		{"orders\x7f", false},
		{"orders.*", false},
		{"orders.>", false},
		{"or*ders", false},
		{"a>b", false},
		{".orders", false},
		{"orders.", false},
		{"orders..created", false},
		{".", false},
		{"\xff", false},
	} {
		err := ValidateTopic(tc.topic)
		if tc.ok != (err == nil) {
			t.Errorf("ValidateTopic(%q) = %v; want ok %v", tc.topic, err, tc.ok)
		}
		var ve *ValidationError
		if err != nil && (!errors.Is(err, ErrInvalidMessage) || !errors.As(err, &ve) || ve.Index != -1 || ve.Field != "topic") {
			t.Errorf("ValidateTopic(%q) = %#v; want a *ValidationError for field topic, index -1", tc.topic, err)
		}
	}
}

func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{"orders", "orders.created", "a.b.c", "", ".", "a..b", "a.", ".a", "a.*", "a.>", "a b", "a\x00", "\xff", "ü.ß"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		if ValidateTopic(topic) != nil {
			return
		}
		if len(topic) > 255 {
			t.Fatalf("accepted %d-byte topic", len(topic))
		}
		if strings.IndexFunc(topic, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
			t.Fatalf("accepted topic %q with whitespace or a control character", topic)
		}
		if strings.ContainsAny(topic, "*>") {
			t.Fatalf("accepted topic %q with a wildcard", topic)
		}
		for _, token := range strings.Split(topic, ".") {
			if token == "" {
				t.Fatalf("accepted topic %q with an empty token", topic)
			}
		}
	})
}

func TestValidateHeaders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    map[string]string
		ok   bool
	}{
		{"nil", nil, true},
		{"empty", map[string]string{}, true},
		{"plain", map[string]string{"Content-Type": "application/json", "X-Trace": "a b\tc", "Empty": ""}, true},
		{"utf-8 value", map[string]string{"x": "ключ 🙂"}, true},
		{"empty key", map[string]string{"": "v"}, false},
		{"colon in key", map[string]string{"a:b": "v"}, false},
		{"space in key", map[string]string{"a b": "v"}, false},
		{"control in key", map[string]string{"a\x01": "v"}, false},
		{"invalid utf-8 key", map[string]string{"\xff": "v"}, false},
		{"reserved key", map[string]string{"Nats-Msg-Id": "v"}, false},
		{"reserved key, other case", map[string]string{"NATS-MSG-ID": "v"}, false},
		{"JetStream control header", map[string]string{"Nats-Rollup": "sub"}, false},
		{"JetStream control header, other case", map[string]string{"nats-expected-last-sequence": "1"}, false},
		{"Nats without the dash", map[string]string{"Natsy": "v"}, true},
		{"CR in value", map[string]string{"k": "a\rb"}, false},
		{"LF in value", map[string]string{"k": "a\nb"}, false},
		{"NUL in value", map[string]string{"k": "a\x00b"}, false},
		{"invalid utf-8 value", map[string]string{"k": "\xff"}, false},
		// What NATS refuses in a key (nats.go: ErrBadHeaderMsg for the
		// whole message), and what does not fit an AMQP short string.
		{"slash in key", map[string]string{"x-trace/id": "v"}, false},
		{"equals in key", map[string]string{"a=b": "v"}, false},
		{"non-ASCII key", map[string]string{"café": "v"}, false},
		{"NATS's punctuation otherwise", map[string]string{"a-b_c.d~e!f#g$h%i&j'k*l+m^n`o|p": "v"}, true},
		{"key of 255 bytes", map[string]string{strings.Repeat("k", 255): "v"}, true},
		{"key of 256 bytes", map[string]string{strings.Repeat("k", 256): "v"}, false},
		{"content-type of 256 bytes", map[string]string{"content-type": strings.Repeat("a", 256)}, false},
		{"Correlation-Id of 256 bytes", map[string]string{"Correlation-Id": strings.Repeat("a", 256)}, false},
		{"other value of 4 KiB", map[string]string{"k": strings.Repeat("a", 4096)}, true},
	} {
		err := ValidateHeaders(tc.h)
		if tc.ok != (err == nil) {
			t.Errorf("%s: ValidateHeaders(%q) = %v; want ok %v", tc.name, tc.h, err, tc.ok)
		}
		var ve *ValidationError
		if err != nil && (!errors.Is(err, ErrInvalidMessage) || !errors.As(err, &ve) || ve.Index != -1 || ve.Field != "headers") {
			t.Errorf("%s: ValidateHeaders = %#v; want a *ValidationError for field headers, index -1", tc.name, err)
		}
	}
}

func TestValidationErrorMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  *ValidationError
		want string
	}{
		{&ValidationError{Index: 3, Field: "topic", Reason: "is empty"}, "invalid outbox message 3: topic: is empty"},
		{&ValidationError{Index: -1, Field: "topic", Reason: "is empty"}, "invalid outbox message: topic: is empty"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}

func TestUUID(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"00000000-0000-0000-0000-000000000000", "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f80", "ffffffff-ffff-ffff-ffff-ffffffffffff"} {
		u, ok := parseUUID(s)
		if !ok || formatUUID(u) != s {
			t.Errorf("parseUUID(%q) round trip = %q, %v", s, formatUUID(u), ok)
		}
	}
	if u, ok := parseUUID("0190A5D2-7C1E-4B8E-9A2F-3D4C5B6A7F80"); !ok || formatUUID(u) != "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f80" {
		t.Errorf("upper case: got %q, %v", formatUUID(u), ok)
	}
	for _, s := range []string{"", "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f8", "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f800", "0190a5d2+7c1e-4b8e-9a2f-3d4c5b6a7f80", "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f8g", "0190a5d27c1e4b8e9a2f3d4c5b6a7f80----"} {
		if _, ok := parseUUID(s); ok {
			t.Errorf("parseUUID(%q) succeeded", s)
		}
	}
	seen := make(map[[16]byte]bool)
	for range 1000 {
		u := newUUID()
		if u[6]>>4 != 4 || u[8]>>6 != 2 || seen[u] {
			t.Fatalf("newUUID() = %s: not version 4 variant 10, or repeated", formatUUID(u))
		}
		seen[u] = true
	}
}

// An id given twice in one batch is refused before anything is sent: the
// unique index would refuse it too, but abort the caller's transaction.
func TestPrepareRefusesAnIDGivenTwice(t *testing.T) {
	t.Parallel()
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	const id = "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f80"
	msgs := []Message{{ID: id, Topic: "t", Payload: []byte{}}, {Topic: "t", Payload: []byte{}}, {ID: id, Topic: "t", Payload: []byte{}}}
	_, err = w.prepare(msgs)
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Index != 2 || ve.Field != "id" {
		t.Fatalf("prepare = %v; want a *ValidationError for message 2, field id", err)
	}
	if _, err := w.prepare(msgs[:2]); err != nil {
		t.Fatalf("prepare of distinct ids: %v", err)
	}
}
