package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
	"github.com/relayd/relayd/relay"
)

// A row that can never be published is parked with its reason and does not
// hold the others; `relayd outbox parked` lists it, and once the cause is
// fixed `relayd outbox retry` puts it back — while the relay runs.
func TestParkedRowsListedAndRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startRelay("relay")
	ctx := context.Background()
	var badID int64
	if err := e.pool.QueryRow(ctx, `INSERT INTO `+e.table.Ident()+` (topic, payload, headers) VALUES ('orders.bad', '\x00', '{"n": 1}') RETURNING id`).Scan(&badID); err != nil {
		t.Fatal(err)
	}
	var good []outbox.Message
	for i := range 50 {
		good = append(good, outbox.Message{Topic: "orders.good", Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := e.writer.Write(ctx, e.pool, good...); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		var done, parked int
		e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+e.table.Delivered()+`), count(*) FILTER (WHERE amqp_parked_at IS NOT NULL AND nats_parked_at IS NOT NULL) FROM `+e.table.Owed()).Scan(&done, &parked)
		return done == 50 && parked == 1
	}, "good rows not delivered / bad row not parked on both targets")

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(relaydBin, append([]string{"outbox"}, args...)...)
		cmd.Env = e.relayEnv()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("relayd outbox %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var rows []relay.ParkedRow
	if err := json.Unmarshal([]byte(run("parked", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != badID || len(rows[0].Targets) != 2 || !strings.Contains(rows[0].Targets[0].Reason, `"n" is not a string`) {
		t.Fatalf("parked: %+v; want the bad row on both targets with its reason", rows)
	}
	if out := run("parked", "--target", "nats"); !strings.Contains(out, "orders.bad") || strings.Count(out, "orders.bad") != 1 {
		t.Fatalf("parked --target nats: %q", out)
	}

	// The producer's bug is fixed in place, in the owed table where the
	// parked row is; put it back.
	if tag, err := e.pool.Exec(ctx, `UPDATE `+e.table.Owed()+` SET headers = '{"n": "1"}' WHERE id = $1`, badID); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("fix the parked row: %v, %d rows", err, tag.RowsAffected())
	}
	if out := run("retry", "--id", fmt.Sprint(badID)); !strings.HasPrefix(out, "2 parked") {
		t.Fatalf("retry: %q, want 2 deliveries (amqp and nats) put back", out)
	}
	e.waitDelivered(30 * time.Second)
	if out := run("parked"); strings.Contains(out, "orders.bad") {
		t.Fatalf("still parked after retry: %q", out)
	}

	cmd := exec.Command(relaydBin, "outbox", "retry")
	cmd.Env = e.relayEnv()
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("retry without --id or --all: exit %d %q, want 2", cmd.ProcessState.ExitCode(), out)
	}
}

// Poison rows — an oversize payload, a topic that is not a subject or is
// empty, headers that are not strings or not an object, a topic RabbitMQ
// cannot route — mixed into 10,000 good rows: every good row arrives, each
// bad one is parked for the target that refuses it, with the reason; once
// the causes are fixed, `relayd outbox retry --all` delivers them.
func TestPoisonRowsAmongGoodOnes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.startRelay("relay", "RELAY_MAX_ATTEMPTS=3", "RELAY_RETRY_MIN=50ms", "RELAY_RETRY_MAX=200ms")
	ctx := context.Background()
	ins := func(topic string, payload []byte, headers string) int64 {
		t.Helper()
		var id int64
		var h any
		if headers != "" {
			h = headers
		}
		if err := e.pool.QueryRow(ctx, `INSERT INTO `+e.table.Ident()+` (topic, payload, headers) VALUES ($1, $2, $3::jsonb) RETURNING id`, topic, payload, h).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	var committed map[string]bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		committed, _ = e.producers(ctx, 4, 12_500, time.Millisecond) // ~10,000 committed
	}()
	oversize := ins("orders.big", make([]byte, int(e.nc.MaxPayload())+1), "")
	badSubject := ins("orders.*", []byte("x"), "")
	badHeaders := ins("orders.h", []byte("x"), `{"retries": 3}`)
	unroutable := ins("nobody.listens", []byte("x"), "")
	noTopic := ins("", []byte("x"), "")
	notObject := ins("orders.h", []byte("x"), `["retries"]`)
	<-done

	parked := func(id int64) (amqpReason, natsReason string) {
		var a, n *string
		e.pool.QueryRow(ctx, `SELECT CASE WHEN amqp_parked_at IS NOT NULL THEN amqp_last_error END,
			CASE WHEN nats_parked_at IS NOT NULL THEN nats_last_error END FROM `+e.table.Owed()+` WHERE id = $1`, id).Scan(&a, &n)
		if a != nil {
			amqpReason = *a
		}
		if n != nil {
			natsReason = *n
		}
		return
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		var good int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Delivered()).Scan(&good)
		_, n1 := parked(oversize)
		_, n2 := parked(badSubject)
		a3, n3 := parked(badHeaders)
		a4, _ := parked(unroutable)
		a5, n5 := parked(noTopic)
		a6, n6 := parked(notObject)
		return good == len(committed) && n1 != "" && n2 != "" && a3 != "" && n3 != "" && a4 != "" && a5 != "" && n5 != "" && a6 != "" && n6 != ""
	}, "good rows not all delivered, or poison rows not parked")
	for _, c := range []struct {
		id         int64
		amqp, nats string // expected reason fragments; "" = delivered there
	}{
		{oversize, "", "max_payload"},
		{badSubject, "", "not a valid subject"},
		{badHeaders, `"retries" is not a string`, `"retries" is not a string`},
		{unroutable, "gave up after 3 attempts", ""},
		{noTopic, "topic: is empty", "topic: is empty"},
		{notObject, "headers: not a JSON object", "headers: not a JSON object"},
	} {
		a, n := parked(c.id)
		if (c.amqp == "") != (a == "") || !strings.Contains(a, c.amqp) || (c.nats == "") != (n == "") || !strings.Contains(n, c.nats) {
			t.Errorf("row %d: parked amqp %q nats %q; want amqp %q nats %q", c.id, a, n, c.amqp, c.nats)
		}
	}

	// Fix the causes in the owed table, where parked rows are, then put
	// everything back.
	for _, q := range []string{
		`UPDATE ` + e.table.Owed() + ` SET payload = '\x00' WHERE id = ` + fmt.Sprint(oversize),
		`UPDATE ` + e.table.Owed() + ` SET topic = 'orders.star' WHERE id = ` + fmt.Sprint(badSubject),
		`UPDATE ` + e.table.Owed() + ` SET headers = '{"retries": "3"}' WHERE id = ` + fmt.Sprint(badHeaders),
		`UPDATE ` + e.table.Owed() + ` SET topic = 'orders.topic' WHERE id = ` + fmt.Sprint(noTopic),
		`UPDATE ` + e.table.Owed() + ` SET headers = '{"retries": "3"}' WHERE id = ` + fmt.Sprint(notObject),
	} {
		if tag, err := e.pool.Exec(ctx, q); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("%s: %v, %d rows", q, err, tag.RowsAffected())
		}
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.QueueBind(e.queue, "nobody.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(relaydBin, "outbox", "retry", "--all")
	cmd.Env = e.relayEnv()
	if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "9 parked") {
		t.Fatalf("retry --all: %v %q; want 9 deliveries put back", err, out)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		var left int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+pending(e.table)).Scan(&left)
		return left == 0
	}, "fixed rows not delivered after retry")
	if !r.running() {
		t.Fatal("relayd exited")
	}
}

// A stream out of room is the broker's state, not the rows': with the
// stream full (DiscardNew at MaxMsgs), relayd holds the rows JetStream
// refuses — not parked, even at RELAY_MAX_ATTEMPTS=1, where one counted
// failure parks a row — while RabbitMQ gets every row, and delivers them
// once there is room, each once.
func TestFullStreamHoldsRowsWithoutParking(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.limitStream(5, -1)
	e.startRelay("relay", "RELAY_MAX_ATTEMPTS=1", "RELAY_RETRY_MIN=100ms", "RELAY_RETRY_MAX=200ms")
	var msgs []outbox.Message
	for i := range 12 {
		msgs = append(msgs, outbox.Message{Topic: "orders.full", Payload: []byte(fmt.Sprint(i))})
	}
	if _, err := e.writer.Write(ctx, e.pool, msgs...); err != nil {
		t.Fatal(err)
	}
	committed := e.committedIDs()
	var amqpN, natsN, refused, parked int
	state := func() {
		t.Helper()
		_, amqpN, natsN = e.counts()
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE nats_last_error LIKE '%maximum messages exceeded%' AND nats_attempts = 0),
			count(*) FILTER (WHERE amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL) FROM `+e.table.Owed()).Scan(&refused, &parked); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		state()
		return amqpN == 12 && natsN == 5 && refused == 7
	}, "want RabbitMQ to have all 12 rows, JetStream 5, and the other 7 refused for room with no attempt counted")
	// Retries meanwhile (every 100–200 ms here): each is refused again, and
	// none parks the row.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if state(); parked > 0 || natsN != 5 || refused != 7 {
			t.Fatalf("stream full: %d rows parked, %d delivered to nats, %d refused with no attempt counted; want 0, 5, 7", parked, natsN, refused)
		}
		time.Sleep(100 * time.Millisecond)
	}

	e.limitStream(-1, -1)
	e.waitDelivered(30 * time.Second)
	if state(); parked > 0 {
		t.Fatalf("%d rows parked", parked)
	}
	e.checkExactlyOnce(committed, false)
}

// limitStream sets the test's stream to refuse new messages (DiscardNew)
// past maxMsgs messages and maxBytes bytes (-1: no limit).
func (e *env) limitStream(maxMsgs, maxBytes int64) {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs, cfg.MaxBytes, cfg.Discard = maxMsgs, maxBytes, jetstream.DiscardNew
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		e.t.Fatal(err)
	}
}
