package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// estate is a legacy RabbitMQ estate of one test: the three shapes relayd
// must reproduce in dual write, each with the queue its consumers read, and
// a second JetStream stream beside the test's default one.
type estate struct {
	id string
	// MassTransit: a fanout exchange per message type, both bound to one
	// consumer's queue.
	typeExchange func(msgType string) string
	billingQueue string
	// Spring: a topic exchange per domain, its queue bound by pattern.
	shipping, shippingQueue string
	// Celery: a queue reached through the default exchange.
	celeryQueue string
	// The second stream, for billing and tasks.
	stream, prefix string
}

func newEstate(t *testing.T, e *env) *estate {
	t.Helper()
	id := testenv.Name("est")
	s := &estate{id: id,
		typeExchange: func(msgType string) string { return id + ".Contracts:" + msgType },
		billingQueue: id + "_billing", shipping: id + ".shipping", shippingQueue: id + "_shipping",
		celeryQueue: id + "_celery", stream: strings.ToUpper(id) + "_B", prefix: id + "b."}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{s.billingQueue, s.shippingQueue, s.celeryQueue} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		must(err)
	}
	for _, typ := range []string{"InvoiceCreated", "InvoicePaid"} {
		must(ch.ExchangeDeclare(s.typeExchange(typ), amqp.ExchangeFanout, true, false, false, false, nil))
		must(ch.QueueBind(s.billingQueue, "", s.typeExchange(typ), false, nil))
	}
	must(ch.ExchangeDeclare(s.shipping, amqp.ExchangeTopic, true, false, false, false, nil))
	must(ch.QueueBind(s.shippingQueue, "label.#", s.shipping, false, nil))
	t.Cleanup(func() {
		c, err := amqp.Dial(e.amqpURL)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			for _, q := range []string{s.billingQueue, s.shippingQueue, s.celeryQueue} {
				ch.QueueDelete(q, false, false, false)
			}
			for _, x := range []string{s.typeExchange("InvoiceCreated"), s.typeExchange("InvoicePaid"), s.shipping} {
				ch.ExchangeDelete(x, false, false)
			}
		}
	})
	testenv.CreateStream(t, context.Background(), e.js, jetstream.StreamConfig{
		Name: s.stream, Subjects: []string{s.prefix + ">"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	})
	t.Cleanup(func() { e.js.DeleteStream(context.Background(), s.stream) })
	return s
}

// routes is the estate's routes file.
func (s *estate) routes() string {
	return fmt.Sprintf(`routes:
  - name: billing
    topic: billing.*
    amqp: {exchange: "%[1]s.Contracts:{1}", routing_key: ""}
    nats: {subject: "%[1]sb.billing.{1}", stream: %[2]s}
  - name: shipping
    topic: shipping.>
    amqp: {exchange: "%[1]s.shipping", routing_key: "{1}"}
  - name: tasks
    topic: tasks.>
    amqp: {exchange: "", routing_key: "%[1]s_celery"}
    nats: {subject: "%[1]sb.tasks.{1}", stream: %[2]s}
`, s.id, s.stream)
}

func writeRoutes(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// legacyMessage is one message as a legacy service published it, and the
// same logical message as a row of the outbox: its topic, and its
// properties as headers.
type legacyMessage struct {
	exchange, key string // where the legacy service published it
	topic         string // the row's
	queue         string // where its consumers read it
	subject       string // where JetStream is to store the relayed copy
	stream        string
}

// legacyPublishing is what a legacy service sends: every property a
// consumer may read, and a header of its own.
func legacyPublishing(body string) amqp.Publishing {
	return amqp.Publishing{
		Headers:         amqp.Table{"x-tenant": "acme", "x-schema": "v2"},
		ContentType:     "application/json",
		ContentEncoding: "identity",
		DeliveryMode:    amqp.Persistent,
		Priority:        5,
		CorrelationId:   "corr-" + body,
		ReplyTo:         "replies",
		Expiration:      "3600000",
		MessageId:       "legacy-" + body,
		Timestamp:       time.Now(),
		Type:            "Acme.Contracts.Invoice",
		UserId:          "guest",
		AppId:           "billing-service",
		Body:            []byte(body),
	}
}

// rowHeaders is legacyPublishing as an outbox row writes it.
func rowHeaders(body string) map[string]string {
	return map[string]string{
		"x-tenant": "acme", "x-schema": "v2", "content-type": "application/json", "content-encoding": "identity",
		"priority": "5", "correlation-id": "corr-" + body, "reply-to": "replies", "expiration": "3600000",
		"type": "Acme.Contracts.Invoice", "user-id": "guest", "app-id": "billing-service",
	}
}

// In dual write through routes, each legacy consumer gets from relayd what
// the legacy service sent it itself — exchange, routing key, body, every
// property and header but message-id and timestamp — in the three shapes of
// estate; JetStream gets each message once, on the route's subject, in the
// stream that captures it.
func TestEstateRoutesLookLikeTheLegacyPublisher(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newEstate(t, e)
	msgs := []legacyMessage{
		{exchange: s.typeExchange("InvoiceCreated"), key: "", topic: "billing.InvoiceCreated", queue: s.billingQueue,
			subject: s.prefix + "billing.InvoiceCreated", stream: s.stream},
		{exchange: s.typeExchange("InvoicePaid"), key: "", topic: "billing.InvoicePaid", queue: s.billingQueue,
			subject: s.prefix + "billing.InvoicePaid", stream: s.stream},
		{exchange: s.shipping, key: "label.printed", topic: "shipping.label.printed", queue: s.shippingQueue,
			subject: e.prefix + "shipping.label.printed", stream: e.stream},
		{exchange: "", key: s.celeryQueue, topic: "tasks.send_invoice", queue: s.celeryQueue,
			subject: s.prefix + "tasks.send_invoice", stream: s.stream},
	}
	relay := e.startRelay("relayd", "RELAY_ROUTES="+writeRoutes(t, s.routes()))

	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ctx := context.Background()
	ids := map[string]legacyMessage{}
	for i, m := range msgs {
		body := fmt.Sprintf(`{"n": %d}`, i)
		headers, _ := json.Marshal(rowHeaders(body))
		if err := ch.PublishWithContext(ctx, m.exchange, m.key, true, false, legacyPublishing(body)); err != nil {
			t.Fatal(err)
		}
		legacy := getOne(t, ch, m.queue)
		var id string
		if err := e.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s (topic, headers, payload) VALUES ($1, $2, $3) RETURNING message_id::text`, e.table),
			m.topic, headers, []byte(body)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id] = m
		relayed := getOne(t, ch, m.queue)
		if relayed.MessageId != id {
			t.Fatalf("%s: the queue's next message is %q, want the row's %s", m.topic, relayed.MessageId, id)
		}
		if diff := compareDeliveries(legacy, relayed); diff != "" {
			t.Errorf("%s: relayd's copy differs from the legacy publish:\n%s", m.topic, diff)
		}
	}

	// JetStream: each row once, on its route's subject, in its stream.
	for _, stream := range []string{e.stream, s.stream} {
		got := map[string][]string{} // filled in place: the failure prints what was read last
		testenv.Eventually(t, 20*time.Second, func() bool {
			clear(got)
			maps.Copy(got, streamSubjects(t, e.js, stream))
			want := 0
			for _, m := range msgs {
				if m.stream == stream {
					want++
				}
			}
			return len(got) >= want
		}, "stream %s: %v", stream, got)
		for id, m := range ids {
			subjects := got[id]
			switch {
			case m.stream != stream && len(subjects) > 0:
				t.Errorf("%s: in stream %s too, on %v", m.topic, stream, subjects)
			case m.stream == stream && (len(subjects) != 1 || subjects[0] != m.subject):
				t.Errorf("%s: stream %s holds it on %v, want once on %s", m.topic, stream, subjects, m.subject)
			}
		}
	}
	if strings.Contains(relay.out.String(), "level=WARN") {
		t.Errorf("relayd warned:\n%s", relay.out.String())
	}
	// verify finds each row in the stream its route names, once the relay
	// has recorded every row: a message can be in its stream before that.
	e.waitDelivered(30 * time.Second)
	cmd := exec.Command(relaydBin, "verify", "--json")
	cmd.Env = e.relayEnv("RELAY_METRICS_ADDR=", "RELAY_ROUTES="+writeRoutes(t, s.routes()))
	out, err := cmd.Output()
	var rep struct {
		Outbox    struct{ Checked, Missing int64 }
		MoreScans []struct{ Stream string } `json:"more_scans"`
	}
	if jerr := json.Unmarshal(out, &rep); err != nil || jerr != nil || rep.Outbox.Checked != int64(len(msgs)) || rep.Outbox.Missing != 0 ||
		len(rep.MoreScans) != 1 || rep.MoreScans[0].Stream != s.stream {
		t.Errorf("relayd verify: %v, %+v; want %d rows checked, none missing, stream %s scanned too\n%s", err, rep, len(msgs), s.stream, out)
	}
}

// getOne takes the next message of queue, waiting for it.
func getOne(t *testing.T, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	var d amqp.Delivery
	testenv.Eventually(t, 20*time.Second, func() bool {
		var ok bool
		var err error
		if d, ok, err = ch.Get(queue, true); err != nil {
			t.Fatal(err)
		}
		return ok
	}, "no message in queue %s", queue)
	return d
}

// compareDeliveries lists how b differs from a as a consumer sees them,
// leaving out the message-id and timestamp (the relay's own) and what the
// delivery itself adds (tags, redelivered, count).
func compareDeliveries(a, b amqp.Delivery) string {
	type seen struct {
		Exchange, RoutingKey, ContentType, ContentEncoding, CorrelationId, ReplyTo, Expiration, Type, UserId, AppId string
		DeliveryMode, Priority                                                                                      uint8
		Headers                                                                                                     amqp.Table
		Body                                                                                                        string
	}
	view := func(d amqp.Delivery) seen {
		return seen{d.Exchange, d.RoutingKey, d.ContentType, d.ContentEncoding, d.CorrelationId, d.ReplyTo, d.Expiration, d.Type, d.UserId, d.AppId,
			d.DeliveryMode, d.Priority, d.Headers, string(d.Body)}
	}
	va, vb := view(a), view(b)
	if reflect.DeepEqual(va, vb) {
		return ""
	}
	return fmt.Sprintf("legacy: %+v\nrelayd: %+v", va, vb)
}

// streamSubjects reads every message of stream: the subjects each message
// id is stored on.
func streamSubjects(t *testing.T, js jetstream.JetStream, stream string) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		out[id] = append(out[id], m.Subject)
	}
	return out
}

// A route change while rows are under way: a row keeps the route it first
// went by. RabbitMQ took it under the first routes while its stream was
// missing; the relay that publishes it to JetStream once the stream exists
// reads other routes, and still sends it on the first route's subject. A
// row written after the change goes by the new routes.
func TestRouteChangeKeepsARowsFirstRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	id := testenv.Name("rc")
	oldStream, oldX, newX := strings.ToUpper(id)+"_OLD", id+".old", id+".new"
	queues := map[string]string{oldX: id + "_old_q", newX: id + "_new_q"}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for x, q := range queues {
		if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "", x, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	routes := func(exchange, subject, stream string) string {
		return fmt.Sprintf("routes:\n  - topic: audit.*\n    amqp: {exchange: %q}\n    nats: {subject: %q, stream: %q}\n", exchange, subject, stream)
	}
	oldSubject, newSubject := id+"old.audit.login", e.prefix+"audit.v2.login"
	fast := []string{"RELAY_RETRY_MIN=100ms", "RELAY_RETRY_MAX=1s"}

	first := e.startRelay("relayd (old routes)", append(fast, "RELAY_ROUTES="+writeRoutes(t, routes(oldX, id+"old.audit.{1}", oldStream)))...)
	var rowID string
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s (topic, payload) VALUES ('audit.login', 'x') RETURNING message_id::text`, e.table)).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	// RabbitMQ has it; JetStream waits for the stream, the row not parked.
	var recorded string
	testenv.Eventually(t, 20*time.Second, func() bool {
		err := e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(nats_subject, '') FROM %s_owed
			WHERE message_id = $1 AND amqp_delivered_at IS NOT NULL AND nats_delivered_at IS NULL AND nats_parked_at IS NULL`, e.table), rowID).Scan(&recorded)
		return err == nil && recorded != ""
	}, "the row is not delivered to RabbitMQ and owed to JetStream with its route")
	if recorded != oldSubject {
		t.Fatalf("the owed row's recorded subject is %q, want %q", recorded, oldSubject)
	}
	if code := first.stop(30 * time.Second); code != 0 {
		t.Fatalf("relayd exited %d", code)
	}

	e.startRelay("relayd (new routes)", append(fast, "RELAY_ROUTES="+writeRoutes(t, routes(newX, e.prefix+"audit.v2.{1}", "")))...)
	testenv.CreateStream(t, ctx, e.js, jetstream.StreamConfig{Name: oldStream, Subjects: []string{id + "old.>"}, Storage: jetstream.FileStorage})
	t.Cleanup(func() { e.js.DeleteStream(context.Background(), oldStream) })
	var newID string
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s (topic, payload) VALUES ('audit.login', 'y') RETURNING message_id::text`, e.table)).Scan(&newID); err != nil {
		t.Fatal(err)
	}
	var inOld, inNew map[string][]string
	testenv.Eventually(t, 30*time.Second, func() bool {
		inOld, inNew = streamSubjects(t, e.js, oldStream), streamSubjects(t, e.js, e.stream)
		return len(inOld[rowID]) > 0 && len(inNew[newID]) > 0
	}, "JetStream: old stream %v, default stream %v", inOld, inNew)
	if got := inOld[rowID]; len(got) != 1 || got[0] != oldSubject || len(inNew[rowID]) != 0 {
		t.Errorf("the row first routed by the old routes is on %v in the old stream and %v in the default one; want once, on %s",
			got, inNew[rowID], oldSubject)
	}
	if got := inNew[newID]; len(got) != 1 || got[0] != newSubject {
		t.Errorf("the row written after the change is on %v, want once on %s", got, newSubject)
	}
	want := map[string]map[string]int{queues[oldX]: {rowID: 1}, queues[newX]: {newID: 1}}
	for _, q := range queues {
		got := map[string]int{}
		testenv.Eventually(t, 10*time.Second, func() bool {
			for {
				d, ok, err := ch.Get(q, true)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				got[d.MessageId]++
			}
			return reflect.DeepEqual(got, want[q])
		}, "queue %s holds %v, want %v", q, got, want[q])
	}
}

// A route naming an exchange RabbitMQ lacks: relayd says so at start, that
// route's rows wait (never parked, no attempt used) while the other rows
// go, and once the exchange is declared they are delivered.
func TestRouteToAMissingExchangeWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	missing := testenv.Name("mx")
	routes := "RELAY_ROUTES=" + writeRoutes(t, fmt.Sprintf("routes:\n  - topic: audit.*\n    amqp: {exchange: %q, routing_key: \"orders.{1}\"}\n", missing))
	check := func() (int, string) {
		cmd := exec.Command(relaydBin, "routes", "check")
		cmd.Env = e.relayEnv(routes)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	if code, out := check(); code != 1 || !strings.Contains(out, "routes[0] (amqp): RabbitMQ has no exchange "+missing) {
		t.Errorf("relayd routes check: exit %d, want 1 naming the missing exchange:\n%s", code, out)
	}
	relay := e.startRelay("relayd", "RELAY_RETRY_MIN=100ms", "RELAY_RETRY_MAX=1s", "RELAY_MAX_ATTEMPTS=2", routes)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(relay.out.String(), "RabbitMQ has no exchange "+missing)
	}, "relayd did not name the missing exchange at start")

	ids := map[string]string{}
	for _, topic := range []string{"audit.login", "orders.created"} {
		var id string
		if err := e.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s (topic, payload) VALUES ($1, 'x') RETURNING message_id::text`, e.table), topic).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[topic] = id
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if d := getOne(t, ch, e.queue); d.MessageId != ids["orders.created"] {
		t.Fatalf("the queue's first message is %s, want the other route's row %s", d.MessageId, ids["orders.created"])
	}
	// Past its two attempts, and still not parked.
	var attempts int
	var lastErr string
	testenv.Eventually(t, 20*time.Second, func() bool {
		err := e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT amqp_attempts, coalesce(amqp_last_error, '') FROM %s_owed
			WHERE message_id = $1 AND amqp_parked_at IS NULL AND amqp_delivered_at IS NULL AND nats_delivered_at IS NOT NULL`, e.table), ids["audit.login"]).Scan(&attempts, &lastErr)
		return err == nil && strings.Contains(lastErr, "does not exist") && strings.Contains(relay.out.String(), "that route's rows wait")
	}, "the row of the missing exchange does not wait, named")
	if attempts != 0 {
		t.Errorf("the waiting row used %d attempts, want 0", attempts)
	}

	if err := ch.ExchangeDeclare(missing, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// A fanout on to the test's exchange, with the route's key orders.login.
	if err := ch.ExchangeBind(e.exchange, "", missing, false, nil); err != nil {
		t.Fatal(err)
	}
	if d := getOne(t, ch, e.queue); d.MessageId != ids["audit.login"] {
		t.Fatalf("the queue's next message is %s, want the waiting row %s", d.MessageId, ids["audit.login"])
	}
	if code, out := check(); code != 0 {
		t.Errorf("relayd routes check, every exchange and stream there: exit %d, want 0:\n%s", code, out)
	}
}

// The backfill drains a queue of the estate as the relay would have sent
// its messages: a legacy publish to a per-type exchange lands in the route's
// stream on the route's subject, with the headers the relayed copy of the
// same message has, and the message relayd itself put in the queue is not
// moved twice.
func TestBackfillByRoutesLandsWhereTheRelayWould(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newEstate(t, e)
	ctx := context.Background()
	routes := "RELAY_ROUTES=" + writeRoutes(t, s.routes())
	relay := e.startRelay("relayd", routes)
	const body = `{"invoice": 7}`
	headers, _ := json.Marshal(rowHeaders(body))
	var relayed string
	if err := e.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s (topic, headers, payload) VALUES ('billing.InvoiceCreated', $1, $2) RETURNING message_id::text`, e.table),
		headers, []byte(body)).Scan(&relayed); err != nil {
		t.Fatal(err)
	}
	e.waitDelivered(20 * time.Second)
	if code := relay.stop(30 * time.Second); code != 0 {
		t.Fatalf("relayd exited %d", code)
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	legacy := legacyPublishing(body)
	legacy.MessageId = "6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b10"
	if err := ch.PublishWithContext(ctx, s.typeExchange("InvoiceCreated"), "", true, false, legacy); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(relaydBin, "backfill", "--queue", s.billingQueue, "--json")
	cmd.Env = e.relayEnv("RELAY_METRICS_ADDR=", routes)
	dieWithTest(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("relayd backfill: %v\n%s", err, out)
	}
	st, err := e.js.Stream(ctx, s.stream)
	if err != nil {
		t.Fatal(err)
	}
	got := streamSubjects(t, e.js, s.stream)
	subject := s.prefix + "billing.InvoiceCreated"
	if len(got) != 2 || len(got[relayed]) != 1 || len(got[legacy.MessageId]) != 1 || got[legacy.MessageId][0] != subject {
		t.Fatalf("stream %s holds %v; want the relayed message once and the legacy one once, on %s", s.stream, got, subject)
	}
	// The same headers either way, but for what only one side has.
	view := func(seq uint64) map[string]string {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for k, v := range m.Header {
			if !strings.HasPrefix(k, "Nats-") && !strings.HasPrefix(k, "Amqp-") {
				out[k] = v[0]
			}
		}
		return out
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := view(info.State.FirstSeq), view(info.State.LastSeq); !reflect.DeepEqual(a, b) {
		t.Errorf("the relayed and the backfilled copy differ in headers:\nrelayed:    %v\nbackfilled: %v", a, b)
	}
}

// A rollback sends a message back the way its route sent it: relayd replay
// of a route's stream publishes to the route's exchange and routing key,
// with the properties the row's headers set, what the legacy service sent.
func TestReplayByRoutesGoesBackWhereItCameFrom(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newEstate(t, e)
	ctx := context.Background()
	const body = `{"invoice": 9}`
	// As the relay stored it in the nats-only phase: the route's subject,
	// the row's headers, its id.
	id := "0b9d1a52-5f3e-4c1e-9a57-2b8f0f6f1c11"
	m := &nats.Msg{Subject: s.prefix + "billing.InvoicePaid", Data: []byte(body), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
	for k, v := range rowHeaders(body) {
		m.Header[k] = []string{v}
	}
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(relaydBin, "replay", "--json", "--from-seq", "1", "--stream", s.stream)
	cmd.Env = e.relayEnv("RELAY_METRICS_ADDR=", "RELAY_ROUTES="+writeRoutes(t, s.routes()))
	dieWithTest(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("relayd replay: %v\n%s", err, out)
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	replayed := getOne(t, ch, s.billingQueue)
	if err := ch.PublishWithContext(ctx, s.typeExchange("InvoicePaid"), "", true, false, legacyPublishing(body)); err != nil {
		t.Fatal(err)
	}
	legacy := getOne(t, ch, s.billingQueue)
	if replayed.MessageId != id {
		t.Fatalf("the billing queue got %q, want the replayed %s", replayed.MessageId, id)
	}
	if diff := compareDeliveries(legacy, replayed); diff != "" {
		t.Errorf("the replayed message differs from the legacy publish:\n%s", diff)
	}
}
