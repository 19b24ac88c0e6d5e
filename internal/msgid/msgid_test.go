package msgid

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/uuidtext"
)

func TestDeriveIDIsDeterministicAndContentBound(t *testing.T) {
	base := amqp.Delivery{RoutingKey: "orders.created", Body: []byte(`{"a":1}`), ContentType: "application/json",
		Timestamp: time.Unix(1700000000, 0), Headers: amqp.Table{"b": "2", "a": int32(1)}}
	id := DeriveID(base)
	if !uuidtext.Is(id) || id[14] != '8' {
		t.Fatalf("derived id %q: want a version-8 UUID", id)
	}
	same := base
	same.Headers = amqp.Table{"a": int32(1), "b": "2"} // same headers, other map order
	same.DeliveryTag, same.Redelivered = 99, true      // delivery details do not count
	if DeriveID(same) != id {
		t.Fatal("the same message derived a different id")
	}
	// What RabbitMQ adds on the way — a quorum queue's redelivery count,
	// dead-lettering's history — does not change it.
	redelivered := base
	redelivered.Headers = amqp.Table{"a": int32(1), "b": "2", "x-delivery-count": int64(3),
		"x-death":             []any{amqp.Table{"count": int64(1), "queue": "orders", "reason": "rejected"}},
		"x-first-death-queue": "orders", "x-first-death-reason": "rejected", "x-first-death-exchange": "",
		"x-last-death-queue": "orders", "x-last-death-reason": "rejected", "x-last-death-exchange": "",
		"x-received-from": []any{amqp.Table{"uri": "amqp://upstream"}}}
	if DeriveID(redelivered) != id {
		t.Fatal("RabbitMQ's delivery and dead-letter headers changed the id")
	}
	for name, change := range map[string]func(*amqp.Delivery){
		"body":        func(d *amqp.Delivery) { d.Body = []byte(`{"a":2}`) },
		"routing key": func(d *amqp.Delivery) { d.RoutingKey = "orders.paid" },
		"timestamp":   func(d *amqp.Delivery) { d.Timestamp = d.Timestamp.Add(time.Second) },
		"header":      func(d *amqp.Delivery) { d.Headers = amqp.Table{"a": int32(2), "b": "2"} },
		"x- header":   func(d *amqp.Delivery) { d.Headers = amqp.Table{"a": int32(1), "b": "2", "x-tenant": "t1"} },
		"type":        func(d *amqp.Delivery) { d.Type = "x" },
		// field boundaries are length-prefixed: moving bytes between fields changes the id
		"boundary": func(d *amqp.Delivery) { d.RoutingKey, d.ContentType = "orders.createdapplication/json", "" },
	} {
		d := base
		change(&d)
		if DeriveID(d) == id {
			t.Errorf("changing the %s kept the id", name)
		}
	}
}

func FuzzDeriveID(f *testing.F) {
	f.Add("orders.created", []byte("{}"), "application/json")
	f.Add("", []byte(nil), "")
	f.Fuzz(func(t *testing.T, key string, body []byte, ct string) {
		d := amqp.Delivery{RoutingKey: key, Body: body, ContentType: ct}
		a, b := DeriveID(d), DeriveID(d)
		if a != b || !uuidtext.Is(a) {
			t.Fatalf("DeriveID not a stable UUID: %q %q", a, b)
		}
	})
}

// A timestamp nested in a table or an array gives the same id whatever the
// time zone it was decoded in: amqp091-go decodes to the host's local time.
func TestNestedTimestampsAreUTC(t *testing.T) {
	at := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	ny := at.In(time.FixedZone("EST", -5*3600))
	utc := amqp.Delivery{Headers: amqp.Table{"t": amqp.Table{"at": at}, "a": []any{at}}}
	local := amqp.Delivery{Headers: amqp.Table{"t": amqp.Table{"at": ny}, "a": []any{ny}}}
	if a, b := DeriveID(utc), DeriveID(local); a != b {
		t.Fatalf("DeriveID = %s in UTC, %s in EST", a, b)
	}
}
