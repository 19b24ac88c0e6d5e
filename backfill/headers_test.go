package backfill

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestNATSHeadersCarryPropertiesAndHeaders(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := natsHeaders(amqp.Delivery{
		RoutingKey: "orders.x", ContentType: "application/json", CorrelationId: "c-1", Type: "created", Timestamp: ts,
		Headers: amqp.Table{"traceparent": "00-abc-01", "n": int32(7), "list": []any{"a", int64(1)}, "raw": []byte("b")},
	})
	for k, want := range map[string]string{
		"traceparent": "00-abc-01", "n": "7", "list": `["a",1]`, "raw": "b",
		"Content-Type": "application/json", "Correlation-Id": "c-1", "Amqp-Type": "created",
		"Amqp-Timestamp": "2026-01-02T03:04:05Z", "Amqp-Routing-Key": "orders.x",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
}
