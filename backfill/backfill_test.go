package backfill

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/internal/testenv"
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

func TestMapKeyLongestPrefix(t *testing.T) {
	b := &runner{cfg: Config{SubjectMap: map[string]string{"legacy.": "new.", "legacy.orders.": "orders."}}}
	for in, want := range map[string]string{
		"legacy.orders.created": "orders.created",
		"legacy.users.created":  "new.users.created",
		"other.x":               "other.x",
	} {
		if got := b.mapKey(in); got != want {
			t.Errorf("mapKey(%q) = %q, want %q", in, got, want)
		}
	}
}

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

// Every message goes out with its id as Nats-Msg-Id (JetStream drops a
// repeat within the duplicate window) and the stream it must land in, a
// derived id also as Relay-Derived-Id; a Nats-Msg-Id among the AMQP headers
// does not win.
// prepareRunner is a runner that can prepare messages for stream OUTBOX_X
// under "outbox.": prepare asks NATS for the max payload.
func prepareRunner(t *testing.T) *runner {
	t.Helper()
	if testing.Short() {
		t.Skip("needs NATS")
	}
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &runner{cfg: Config{NATS: nc, Stream: "OUTBOX_X", SubjectPrefix: "outbox."}}
}

// A header key NATS refuses (nats.go fails the whole publish, every time)
// or a Nats- header that would steer JetStream (Nats-Rollup purges the
// subject) makes the message refused for good, with the reason: dead-
// lettered or held, not requeued for ever. Nats-Msg-Id is overwritten.
func TestPrepareRefusesHeadersNATSCannotTake(t *testing.T) {
	b := prepareRunner(t)
	for key, refused := range map[string]bool{
		"x/trace":              true,
		"café":                 true,
		"Nats-Rollup":          true,
		"nats-expected-stream": true,
		"Nats-Msg-Id":          false,
		"__TypeId__":           false,
		"x-death":              false,
	} {
		it := b.prepare(amqp.Delivery{RoutingKey: "orders.x", MessageId: "m-1", Body: []byte("{}"), Headers: amqp.Table{key: "v", "ok": "1"}})
		if got := it.bad != ""; got != refused || (refused && !strings.Contains(it.bad, key)) {
			t.Errorf("header %q: bad %q, want refused %v naming it", key, it.bad, refused)
		}
	}
}

func TestPrepareSetsIDAndExpectedStream(t *testing.T) {
	b := prepareRunner(t)
	withID := b.prepare(amqp.Delivery{RoutingKey: "orders.x", MessageId: "m-1", Body: []byte("{}"),
		Headers: amqp.Table{jetstream.MsgIDHeader: "forged"}})
	derived := b.prepare(amqp.Delivery{RoutingKey: "orders.x", Body: []byte("{}")})
	for _, c := range []struct {
		it     *item
		id     string
		header string
	}{{withID, "m-1", ""}, {derived, derived.id, derived.id}} {
		h := c.it.msg.Header
		if c.it.bad != "" || h.Get(jetstream.MsgIDHeader) != c.id || len(h.Values(jetstream.MsgIDHeader)) != 1 {
			t.Errorf("%s: bad %q, Nats-Msg-Id %q, want %q", c.id, c.it.bad, h.Values(jetstream.MsgIDHeader), c.id)
		}
		if got := h.Get(jetstream.ExpectedStreamHeader); got != "OUTBOX_X" {
			t.Errorf("%s: Nats-Expected-Stream %q, want OUTBOX_X", c.id, got)
		}
		if got := h.Get(DerivedIDHeader); got != c.header {
			t.Errorf("%s: %s %q, want %q", c.id, DerivedIDHeader, got, c.header)
		}
	}
}

// A message is refused for max_payload exactly when nats.go would refuse
// it: its body and its headers as they go on the wire — not a margin that
// refused messages that fit.
func TestPrepareMaxPayloadIsTheClients(t *testing.T) {
	b := prepareRunner(t)
	nc := b.cfg.NATS
	d := amqp.Delivery{RoutingKey: "orders.x", MessageId: "m-1", ContentType: "application/json", Headers: amqp.Table{"trace": "abc"}}
	probe := d
	probe.Body = nil
	headers := jspub.PayloadSize(b.prepare(probe).msg)
	for _, extra := range []int64{-1, 0, 1} {
		d.Body = make([]byte, nc.MaxPayload()-headers+extra)
		it := b.prepare(d)
		// nats.go checks the size before it sends: a core publish to a
		// subject of the test's own says what it would do.
		msg := &nats.Msg{Subject: testenv.Name("maxpayload"), Data: it.msg.Data, Header: it.msg.Header}
		err := nc.PublishMsg(msg)
		if refused := it.bad != ""; refused != errors.Is(err, nats.ErrMaxPayload) || refused != (extra > 0) {
			t.Errorf("body %d bytes (%+d): prepare refused %v (%q), nats.go: %v", len(d.Body), extra, refused, it.bad, err)
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
