package backfill

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/internal/testenv"
)

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

// Every message goes out with its id as Nats-Msg-Id (JetStream drops a
// repeat within the duplicate window) and the stream it must land in, a
// derived id also as Relay-Derived-Id; a Nats-Msg-Id among the AMQP headers
// does not win.
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
