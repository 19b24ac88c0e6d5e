package amqpsink

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A return is said at once, naming the topic, the exchange and the fix;
// the repeats are errlog.PerKey's (tested there).
func TestUnroutableWarningNamesTopicAndExchange(t *testing.T) {
	var buf bytes.Buffer
	w := newUnroutableWarner(slog.New(slog.NewTextHandler(&buf, nil)))
	w.returned(amqp.Return{ReplyCode: 312, ReplyText: "NO_ROUTE", Exchange: "ex", RoutingKey: "orders.created", MessageId: "m"})
	w.returned(amqp.Return{ReplyCode: 312, ReplyText: "NO_ROUTE", Exchange: "ex", RoutingKey: "orders.created", MessageId: "n"})
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(got) != 1 {
		t.Fatalf("two returns of one topic: %q, want one line", got)
	}
	for _, want := range []string{"topic=orders.created", "exchange=ex", "Bind a queue", "reply_code=312", "suppressed=0"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("line %q does not say %q", got[0], want)
		}
	}
}
