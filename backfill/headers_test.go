package backfill

import (
	"maps"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
)

// A drained message carries the NATS headers the relay gives the same
// message from an outbox row: its AMQP headers, and each property under the
// header that sets it (headers.AMQPProperties). Amqp-Timestamp and
// Amqp-Routing-Key say what only the AMQP side has.
func TestNATSHeadersCarryPropertiesAndHeaders(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		d    amqp.Delivery
		want map[string]string
	}{
		{"headers of every type",
			amqp.Delivery{RoutingKey: "orders.x", Headers: amqp.Table{"traceparent": "00-abc-01", "n": int32(7), "list": []any{"a", int64(1)}, "raw": []byte("b")}},
			map[string]string{"traceparent": "00-abc-01", "n": "7", "list": `["a",1]`, "raw": "b", "Amqp-Routing-Key": "orders.x"}},
		{"every property, under the header that sets it",
			amqp.Delivery{RoutingKey: "orders.x", Timestamp: ts, MessageId: "m-1", DeliveryMode: 2,
				ContentType: "application/json", ContentEncoding: "gzip", CorrelationId: "c-1", ReplyTo: "replies",
				Expiration: "60000", Priority: 4, Type: "created", UserId: "shop", AppId: "shop-api"},
			map[string]string{"content-type": "application/json", "content-encoding": "gzip", "correlation-id": "c-1",
				"reply-to": "replies", "expiration": "60000", "priority": "4", "type": "created", "user-id": "shop", "app-id": "shop-api",
				"Amqp-Timestamp": "2026-01-02T03:04:05Z", "Amqp-Routing-Key": "orders.x"}},
		{"a property wins over a header of its name",
			amqp.Delivery{RoutingKey: "k", Type: "created", Headers: amqp.Table{"type": "other", "tenant": "acme"}},
			map[string]string{"type": "created", "tenant": "acme", "Amqp-Routing-Key": "k"}},
		{"a header of a property's name stays when the property is not set",
			amqp.Delivery{RoutingKey: "k", Headers: amqp.Table{"type": "other"}},
			map[string]string{"type": "other", "Amqp-Routing-Key": "k"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := natsHeaders(tc.d)
			got := make(map[string]string, len(h))
			for k, v := range h {
				if len(v) != 1 {
					t.Errorf("header %s has %d values, want 1", k, len(v))
				}
				got[k] = v[0]
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("natsHeaders:\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

// A message the relay published to RabbitMQ from an outbox row, drained by
// backfill, has the row's headers as NATS headers: what the relay gives
// JetStream for the row itself. Names come back in AMQP's spelling.
func TestDrainedAsRelayed(t *testing.T) {
	row := map[string]string{
		"content-type": "application/json", "correlation-id": "c-1", "type": "order.placed", "priority": "2",
		"reply-to": "replies", "app-id": "shop", "tenant": "acme", "traceparent": "00-abc-01",
	}
	pub := amqpsink.Publishing(&relay.Message{MessageID: "m-1", Topic: "orders.placed", Headers: row, CreatedAt: time.Now()})
	d := amqp.Delivery{RoutingKey: "orders.placed", Headers: pub.Headers, ContentType: pub.ContentType,
		ContentEncoding: pub.ContentEncoding, CorrelationId: pub.CorrelationId, ReplyTo: pub.ReplyTo, Expiration: pub.Expiration,
		Priority: pub.Priority, Type: pub.Type, UserId: pub.UserId, AppId: pub.AppId, MessageId: pub.MessageId, Timestamp: pub.Timestamp}
	h := natsHeaders(d)
	delete(h, "Amqp-Timestamp")
	delete(h, "Amqp-Routing-Key")
	got := map[string]string{}
	for k, v := range h {
		got[k] = v[0]
	}
	if !maps.Equal(got, row) {
		t.Errorf("drained headers:\n got %v\nwant the row's %v", got, row)
	}
}
