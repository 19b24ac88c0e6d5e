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
	amqp "github.com/rabbitmq/amqp091-go"

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
		e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+e.table.Delivered()+`), count(*) FILTER (WHERE amqp_parked_at IS NOT NULL AND nats_parked_at IS NOT NULL) FROM `+e.table.Ident()).Scan(&done, &parked)
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

	// The producer's bug is fixed in place; put the row back.
	if _, err := e.pool.Exec(ctx, `UPDATE `+e.table.Ident()+` SET headers = '{"n": "1"}' WHERE id = $1`, badID); err != nil {
		t.Fatal(err)
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

// Poison rows — an oversize payload, a topic that is not a subject, headers
// that are not strings, a topic RabbitMQ cannot route — mixed into 10,000
// good rows: every good row arrives, each bad one is parked for the target
// that refuses it, with the reason; once the causes are fixed, `relayd
// outbox retry --all` delivers them.
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
	<-done

	parked := func(id int64) (amqpReason, natsReason string) {
		var a, n *string
		e.pool.QueryRow(ctx, `SELECT CASE WHEN amqp_parked_at IS NOT NULL THEN amqp_last_error END,
			CASE WHEN nats_parked_at IS NOT NULL THEN nats_last_error END FROM `+e.table.Ident()+` WHERE id = $1`, id).Scan(&a, &n)
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
		return good == len(committed) && n1 != "" && n2 != "" && a3 != "" && n3 != "" && a4 != ""
	}, "good rows not all delivered, or poison rows not parked")
	for _, c := range []struct {
		id         int64
		amqp, nats string // expected reason fragments; "" = delivered there
	}{
		{oversize, "", "max_payload"},
		{badSubject, "", "not a valid subject"},
		{badHeaders, `"retries" is not a string`, `"retries" is not a string`},
		{unroutable, "gave up after 3 attempts", ""},
	} {
		a, n := parked(c.id)
		if (c.amqp == "") != (a == "") || !strings.Contains(a, c.amqp) || (c.nats == "") != (n == "") || !strings.Contains(n, c.nats) {
			t.Errorf("row %d: parked amqp %q nats %q; want amqp %q nats %q", c.id, a, n, c.amqp, c.nats)
		}
	}

	// Fix the causes, then put everything back.
	for _, q := range []string{
		`UPDATE ` + e.table.Ident() + ` SET payload = '\x00' WHERE id = ` + fmt.Sprint(oversize),
		`UPDATE ` + e.table.Ident() + ` SET topic = 'orders.star' WHERE id = ` + fmt.Sprint(badSubject),
		`UPDATE ` + e.table.Ident() + ` SET headers = '{"retries": "3"}' WHERE id = ` + fmt.Sprint(badHeaders),
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
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
	if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "5 parked") {
		t.Fatalf("retry --all: %v %q; want 5 deliveries put back", err, out)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		var left int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Ident()+` WHERE done_at IS NULL`).Scan(&left)
		return left == 0
	}, "fixed rows not delivered after retry")
	if !r.running() {
		t.Fatal("relayd exited")
	}
}

// A broker out of room is the broker's state, not the rows': relayd holds
// the rows it refuses — not parked, even at RELAY_MAX_ATTEMPTS=1, where one
// counted failure parks a row — while the other broker gets every row, and
// delivers them once there is room, each once. JetStream: the stream full
// (DiscardNew at MaxMsgs). RabbitMQ: the queue full and refusing
// (x-overflow reject-publish), which nacks.
func TestFullStreamHoldsRowsWithoutParking(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	limit := func(maxMsgs int64) {
		t.Helper()
		s, err := e.js.Stream(ctx, e.stream)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxMsgs, cfg.Discard = maxMsgs, jetstream.DiscardNew
		if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	limit(5)
	committed := e.holdWithoutParking("nats", "maximum messages exceeded")
	limit(-1)
	e.waitDelivered(60 * time.Second)
	e.requireNoneParked()
	e.checkExactlyOnce(committed, false)
}

func TestFullQueueHoldsRowsWithoutParking(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(e.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.queue, true, false, false, false, amqp.Table{"x-max-length": int32(5), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(e.queue, "orders.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	committed := e.holdWithoutParking("amqp", "nacked by broker")
	// Room: read the queue as it fills, until every row has come.
	got := map[string]int{}
	testenv.Eventually(t, 60*time.Second, func() bool {
		for id, n := range e.queueIDs(500 * time.Millisecond) {
			got[id] += n
		}
		return len(got) >= len(committed)
	}, "the queue never got every row")
	e.waitDelivered(30 * time.Second)
	e.requireNoneParked()
	for id := range committed {
		if got[id] != 1 {
			t.Errorf("message %s reached the queue %d times, want once", id, got[id])
		}
	}
	for id, n := range e.streamIDs() {
		if !committed[id] || n != 1 {
			t.Errorf("stream: message %s %d times (committed: %v), want each committed row once", id, n, committed[id])
		}
	}
}

// holdWithoutParking starts relayd (dual write, RELAY_MAX_ATTEMPTS=1),
// writes 12 rows, and checks that the broker of target, which has room for
// 5, refuses the other 7 with an error containing refusal, while the other
// broker gets all 12 — and that for 2 s of retries none is parked and no
// more reach target. It returns the rows' message ids.
func (e *env) holdWithoutParking(target, refusal string) map[string]bool {
	t := e.t
	t.Helper()
	ctx := context.Background()
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
	state := func() (full, other int) {
		t.Helper()
		_, amqpN, natsN = e.counts()
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE `+target+`_last_error LIKE '%' || $1 || '%'),
			count(*) FILTER (WHERE amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL) FROM `+e.table.Ident(), refusal).Scan(&refused, &parked); err != nil {
			t.Fatal(err)
		}
		if target == "nats" {
			return natsN, amqpN
		}
		return amqpN, natsN
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		full, other := state()
		return full == 5 && other == 12 && refused == 7
	}, "want %s to take 5 rows and refuse 7 (%q), the other broker all 12", target, refusal)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if full, _ := state(); parked > 0 || full != 5 {
			t.Fatalf("%s full: %d rows parked, %d delivered to it; want none parked, 5", target, parked, full)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return committed
}

// requireNoneParked fails the test if a row is parked for either target.
func (e *env) requireNoneParked() {
	e.t.Helper()
	var parked int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table.Ident()+`
		WHERE amqp_parked_at IS NOT NULL OR nats_parked_at IS NOT NULL`).Scan(&parked); err != nil {
		e.t.Fatal(err)
	}
	if parked > 0 {
		e.t.Fatalf("%d rows parked", parked)
	}
}
