package amqpsink

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// One line per topic at once, then none for that topic for unroutableEvery,
// however many returns come; the next line counts those left out. Another
// topic is not held back by the first.
func TestUnroutableWarningIsRateLimitedPerTopic(t *testing.T) {
	var buf bytes.Buffer
	w := newUnroutableWarner(slog.New(slog.NewTextHandler(&buf, nil)))
	now := time.Unix(1_000_000, 0)
	w.now = func() time.Time { return now }
	ret := func(topic string) amqp.Return {
		return amqp.Return{ReplyCode: 312, ReplyText: "NO_ROUTE", Exchange: "ex", RoutingKey: topic, MessageId: "m"}
	}
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }

	w.returned(ret("orders.created"))
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "topic=orders.created") || !strings.Contains(got[0], "exchange=ex") {
		t.Fatalf("after the first return: %q, want one line naming topic and exchange", got)
	}
	for range 5 {
		now = now.Add(time.Second)
		w.returned(ret("orders.created"))
	}
	w.returned(ret("orders.paid"))
	if got := lines(); len(got) != 2 || !strings.Contains(got[1], "topic=orders.paid") {
		t.Fatalf("after repeats and a second topic: %q, want the first line and one for orders.paid", got)
	}
	now = now.Add(unroutableEvery)
	w.returned(ret("orders.created"))
	if got := lines(); len(got) != 3 || !strings.Contains(got[2], "suppressed=5") {
		t.Fatalf("after %v: %q, want a third line with suppressed=5", unroutableEvery, got)
	}
}

// However many distinct topics come back, the warner remembers a bounded
// number of them.
func TestUnroutableWarnerIsBounded(t *testing.T) {
	w := newUnroutableWarner(slog.New(slog.DiscardHandler))
	for i := range 3 * unroutableTopics {
		w.returned(amqp.Return{RoutingKey: strings.Repeat("k", 1+i%7) + string(rune('a'+i%26)) + time.Duration(i).String()})
	}
	if n := len(w.last); n > unroutableTopics {
		t.Fatalf("%d topics remembered, want at most %d", n, unroutableTopics)
	}
}
