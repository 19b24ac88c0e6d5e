package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// quickStartInsert is the README quick start's INSERT, word for word: the
// test runs it with search_path set to its own schema.
const quickStartInsert = `INSERT INTO outbox (topic, payload) VALUES ('orders.created', '{"id": 1}');`

// The quick start: relayd run with RELAY_PROVISION=true creates the table,
// the stream and the exchange; relayd tail runs; the README's plain-SQL
// INSERT arrives on both brokers and tail prints it from each. When tail
// exits, its queue is gone with it.
func TestQuickStart(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"make run\n", "./bin/relayd tail\n", quickStartInsert + "\n"} {
		if !strings.Contains(string(readme), "\n"+cmd) {
			t.Fatalf("the README's quick start lacks %q: this test runs what it says", strings.TrimSpace(cmd))
		}
	}
	q := newQuickStart(t)
	q.start("relayd run", "relay started", "run")
	tail := q.start("relayd tail", "tail: waiting for messages", "tail", "--json")
	queue := tail.logValue("tail: waiting for messages", "queue")
	if !strings.HasPrefix(queue, "amq.gen-") {
		t.Fatalf("tail's queue %q: want a server-named one (amq.gen-...)", queue)
	}

	if _, err := q.sql.Exec(context.Background(), quickStartInsert); err != nil {
		t.Fatalf("the quick start's INSERT: %v", err)
	}
	var msgID string
	if err := q.sql.QueryRow(context.Background(), `SELECT message_id::text FROM outbox`).Scan(&msgID); err != nil {
		t.Fatal(err)
	}
	seen := map[string]map[string]any{}
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, line := range strings.Split(tail.stdout.String(), "\n") {
			var a map[string]any
			if json.Unmarshal([]byte(line), &a) == nil && a["message_id"] == msgID {
				seen[a["broker"].(string)] = a
			}
		}
		return len(seen) == 2
	}, "tail printed the row from %d of 2 brokers: %v\nstdout:\n%s", len(seen), seen, tail.stdout.String())
	for broker, a := range seen {
		if a["topic"] != "orders.created" || a["payload_preview"] != `{"id": 1}` || a["size_bytes"] != 9.0 {
			t.Errorf("%s: tail printed %v, want topic orders.created, payload {\"id\": 1}, 9 bytes", broker, a)
		}
	}

	if code := tail.interrupt(10 * time.Second); code != 0 {
		t.Fatalf("tail exited %d on Ctrl-C, want 0\n%s", code, tail.out.String())
	}
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testenv.Eventually(t, 10*time.Second, func() bool {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		_, err = ch.QueueDeclarePassive(queue, false, true, true, false, nil)
		var ae *amqp.Error
		return errors.As(err, &ae) && ae.Code == amqp.NotFound
	}, "tail's queue %s still exists after tail exited", queue)
}

// Without tail, nothing is bound to the exchange RELAY_PROVISION created
// (it creates no queue): the quick start's row is unroutable on RabbitMQ,
// and relayd says so at once, naming the topic and the exchange.
func TestQuickStartUnroutableIsWarnedOfAtOnce(t *testing.T) {
	t.Parallel()
	q := newQuickStart(t)
	relayd := q.start("relayd run", "relay started", "run")
	if _, err := q.sql.Exec(context.Background(), quickStartInsert); err != nil {
		t.Fatalf("the quick start's INSERT: %v", err)
	}
	var warning map[string]any
	testenv.Eventually(t, 10*time.Second, func() bool {
		warning = relayd.logLine("unroutable")
		return warning != nil
	}, "no unroutable warning in relayd's log:\n%s", relayd.out.String())
	if warning["level"] != "WARN" || warning["topic"] != "orders.created" || warning["exchange"] != q.exchange ||
		!strings.Contains(fmt.Sprint(warning["msg"]), "Bind a queue") {
		t.Fatalf("warning %v: want WARN naming topic orders.created, exchange %s and the fix", warning, q.exchange)
	}
}

// quickStart is a test's own table (in its own schema), stream, subject
// prefix and exchange, none of them created: relayd provisions them.
type quickStart struct {
	t        *testing.T
	sql      *pgxpool.Pool // search_path is the test's schema
	env      []string
	exchange string
}

func newQuickStart(t *testing.T) *quickStart {
	t.Helper()
	id := testenv.Name("qs")
	stream, dbURL, amqpURL, natsURL := strings.ToUpper(id), testenv.DatabaseURL(t), testenv.AMQPURL(t), testenv.NATSURL(t)
	q := &quickStart{t: t, exchange: id, env: []string{
		"PATH=" + os.Getenv("PATH"),
		"RELAY_DATABASE_URL=" + dbURL,
		"RELAY_NATS_URL=" + natsURL,
		"RELAY_AMQP_URL=" + amqpURL,
		"RELAY_OUTBOX_TABLE=" + id + ".outbox",
		"RELAY_NATS_STREAM=" + stream,
		"RELAY_NATS_SUBJECT_PREFIX=" + id + ".",
		"RELAY_AMQP_EXCHANGE=" + id,
		"RELAY_PROVISION=true",
		"RELAY_METRICS_ADDR=127.0.0.1:0",
		"RELAY_LOG_FORMAT=json",
	}}
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = id
	if q.sql, err = pgxpool.NewWithConfig(context.Background(), pc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		q.sql.Exec(ctx, `DROP SCHEMA IF EXISTS "`+id+`" CASCADE`) //nolint:errcheck // best effort: the schema is the test's own
		q.sql.Close()
		if nc, err := nats.Connect(natsURL); err == nil {
			if js, err := jetstream.New(nc); err == nil {
				js.DeleteStream(ctx, stream) //nolint:errcheck // best effort
			}
			nc.Close()
		}
		if c, err := amqp.Dial(amqpURL); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.ExchangeDelete(id, false, false) //nolint:errcheck // best effort
			}
			c.Close()
		}
	})
	return q
}

// qsProc is a relayd command a quick-start test runs: stdout apart from the
// log (stderr).
type qsProc struct {
	*proc
	stdout *testenv.SyncBuffer
}

// start runs relayd with args and waits for a log line whose message
// starts with ready.
func (q *quickStart) start(name, ready string, args ...string) *qsProc {
	q.t.Helper()
	env := q.env
	if args[0] == "tail" {
		env = withoutVar(q.env, "RELAY_DATABASE_URL") // tail needs no Postgres
	}
	p := &qsProc{stdout: &testenv.SyncBuffer{}}
	p.proc = startProc(q.t, name, env, p.stdout, args...)
	testenv.Eventually(q.t, 30*time.Second, func() bool {
		if !p.running() {
			q.t.Fatalf("%s exited at start: %v\n%s", name, p.err, p.out.String())
		}
		return p.logLine(ready) != nil
	}, "%s did not log %q", name, ready)
	return p
}

// logLine returns the first JSON log line whose message contains msg.
func (p *qsProc) logLine(msg string) map[string]any {
	for _, line := range strings.Split(p.out.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && strings.Contains(fmt.Sprint(rec["msg"]), msg) {
			return rec
		}
	}
	return nil
}

// logValue returns attribute key of the log line with msg.
func (p *qsProc) logValue(msg, key string) string {
	p.t.Helper()
	rec := p.logLine(msg)
	v, ok := rec[key].(string)
	if !ok {
		p.t.Fatalf("%s: log line %q has no %s: %v", p.name, msg, key, rec)
	}
	return v
}

// interrupt sends SIGINT (Ctrl-C) and returns the exit code.
func (p *qsProc) interrupt(timeout time.Duration) int {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %v of SIGINT", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

func withoutVar(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
