package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/testenv"
)

func TestPreview(t *testing.T) {
	for _, tc := range []struct {
		in        string
		n         int
		want      string
		truncated bool
	}{
		{`{"id": 1}`, 64, `{"id": 1}`, false},
		{"abcdef", 3, "abc", true},
		{"a\nb\x00\xff", 64, `a\nb\x00\xff`, false},
		{"héllo", 2, "h\u00e9", true}, // a rune is never cut in two
		{"", 64, "", false},
	} {
		got, truncated := preview([]byte(tc.in), tc.n)
		if got != tc.want || truncated != tc.truncated {
			t.Errorf("preview(%q, %d) = %q, %v; want %q, %v", tc.in, tc.n, got, truncated, tc.want, tc.truncated)
		}
	}
}

func TestPrintArrival(t *testing.T) {
	a := arrival{ReceivedAt: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), Broker: "amqp", Topic: "orders.created",
		MessageID: "m-1", Headers: map[string]string{"b": "2", "a": "1\n"}}
	a.setPayload([]byte(strings.Repeat("x", 70)))
	var text, js bytes.Buffer
	if err := printArrival(&text, a, false); err != nil {
		t.Fatal(err)
	}
	want := "03:04:05.006 amqp orders.created message_id=m-1 size=70B headers=a=1\\n,b=2 payload=" + strings.Repeat("x", 64) + "…\n"
	if text.String() != want {
		t.Errorf("text line:\n%q\nwant\n%q", text.String(), want)
	}
	if err := printArrival(&js, a, true); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"broker":"amqp"`, `"topic":"orders.created"`, `"message_id":"m-1"`, `"size_bytes":70`, `"payload_truncated":true`} {
		if !strings.Contains(js.String(), field) {
			t.Errorf("--json line %s lacks %s", js.String(), field)
		}
	}
	if strings.Count(js.String(), "\n") != 1 {
		t.Errorf("--json: %q, want one line", js.String())
	}
}

func TestTailUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"tail", "--help"}, &stdout, &stderr, envconfig.MapLookuper(nil)); code != exitOK || !strings.Contains(stdout.String(), "Usage: relayd tail") {
		t.Fatalf("tail --help: exit %d, stdout %q", code, stdout.String())
	}
	stdout.Reset()
	if code := run([]string{"tail", "extra"}, &stdout, &stderr, envconfig.MapLookuper(nil)); code != exitUsage || !strings.Contains(stderr.String(), `unexpected argument "extra"`) {
		t.Fatalf("tail extra: exit %d, stderr %q", code, stderr.String())
	}
}

// tail needs no RELAY_DATABASE_URL, and says what to do about a stream or
// exchange that does not exist instead of waiting.
func TestTailMissingStreamOrExchange(t *testing.T) {
	t.Parallel()
	name := testenv.Name("notail")
	for _, tc := range []struct {
		target, want string
	}{
		{"nats", strings.ToUpper(name)},
		{"amqp", name},
	} {
		env := map[string]string{
			"RELAY_TARGETS": tc.target, "RELAY_NATS_URL": testenv.NATSURL(t), "RELAY_AMQP_URL": testenv.AMQPURL(t),
			"RELAY_NATS_STREAM": strings.ToUpper(name), "RELAY_AMQP_EXCHANGE": name,
		}
		var stdout, stderr bytes.Buffer
		code := run([]string{"tail"}, &stdout, &stderr, envconfig.MapLookuper(env))
		if code != exitFailure || !strings.Contains(stderr.String(), tc.want) || !strings.Contains(stderr.String(), "does not exist") || !strings.Contains(stderr.String(), "RELAY_PROVISION=true") {
			t.Errorf("tail of %s: exit %d, stderr %q; want 1, %s does not exist, and the fix", tc.target, code, stderr.String(), tc.want)
		}
	}
}
