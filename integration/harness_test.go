// Package integration runs relayd end to end against real Postgres, RabbitMQ
// and NATS JetStream: the built binary as separate processes (so SIGKILL is
// real), producers writing through the outbox package, and checks that read
// every message back from both brokers.
package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
	"github.com/relayd/relayd/schema"
)

// relaydBin is the relayd binary built once for the whole package.
var relaydBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "relayd-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	relaydBin = filepath.Join(dir, "relayd")
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	build := exec.Command("go", "build", "-o", relaydBin, "./cmd/relayd")
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build relayd:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's private corner of the three services: its own outbox
// table (in its own schema), stream, subject prefix, exchange and queue.
type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	table    schema.Table
	writer   *outbox.Writer
	dbURL    string
	natsURL  string
	amqpURL  string
	stream   string
	prefix   string
	exchange string
	queue    string
	nc       *nats.Conn
	js       jetstream.JetStream
	amqpConn *amqp.Connection
}

// newEnv sets a test up against the shared services; natsURL, when given,
// replaces the shared NATS (for tests that stop their own server).
func newEnv(t *testing.T, natsURL ...string) *env {
	t.Helper()
	u := ""
	if len(natsURL) > 0 {
		u = natsURL[0]
	}
	return newEnvNATS(t, u)
}

// newEnvNATS is newEnv with a NATS URL ("" for the shared one) and options
// for the test's own NATS client.
func newEnvNATS(t *testing.T, natsURL string, natsOpts ...nats.Option) *env {
	t.Helper()
	return newEnvAt(t, testenv.AMQPURL(t), natsURL, natsOpts...)
}

// newEnvAt is newEnvNATS with the RabbitMQ at amqpURL.
func newEnvAt(t *testing.T, amqpURL, natsURL string, natsOpts ...nats.Option) *env {
	t.Helper()
	return newEnvIn(t, testenv.DatabaseURL(t), amqpURL, natsURL, natsOpts...)
}

// newEnvOwnDatabase is newEnv in a database of the test's own: for a test
// that holds a transaction open for seconds, which would hold back the
// others' migrations (CREATE INDEX CONCURRENTLY waits for older snapshots).
func newEnvOwnDatabase(t *testing.T) *env {
	t.Helper()
	return newEnvIn(t, testenv.Database(t), testenv.AMQPURL(t), "")
}

// newEnvIn is newEnvAt with the database at dbURL.
func newEnvIn(t *testing.T, dbURL, amqpURL, natsURL string, natsOpts ...nats.Option) *env {
	t.Helper()
	e := &env{t: t, dbURL: dbURL, amqpURL: amqpURL, natsURL: natsURL}
	if e.natsURL == "" {
		e.natsURL = testenv.NATSURL(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if e.pool, err = pgxpool.New(ctx, dbURL); err != nil {
		t.Fatalf("connect to postgres: %v", err)
	}
	t.Cleanup(e.pool.Close)
	e.table = testenv.Outbox(t, e.pool)
	if e.writer, err = outbox.New(outbox.Config{Table: e.table.String()}); err != nil {
		t.Fatal(err)
	}
	id := testenv.Name("it")
	e.stream = strings.ToUpper(id)
	e.prefix = id + "."
	e.exchange = id
	e.queue = id + "_q"
	e.connectNATS(e.natsURL, natsOpts...)
	e.setupAMQP()
	return e
}

func (e *env) connectNATS(url string, opts ...nats.Option) {
	t := e.t
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(nc.Close)
	e.nc = nc
	if e.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	testenv.CreateStream(e.t, ctx, e.js, jetstream.StreamConfig{
		Name: e.stream, Subjects: []string{e.prefix + ">"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	})
	t.Cleanup(func() {
		// A test's own server may be gone by now, and its stream with it:
		// do not wait out JetStream's 5 s default for it.
		if !e.nc.IsConnected() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		e.js.DeleteStream(ctx, e.stream) //nolint:errcheck // best effort
	})
}

func (e *env) setupAMQP() {
	t := e.t
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatalf("amqp dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	e.amqpConn = conn
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(e.exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// Bind the topics the tests use; "unbound.#" is deliberately left out.
	for _, key := range []string{"orders.#", "test.#"} {
		if err := ch.QueueBind(e.queue, key, e.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(e.amqpURL)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			ch.QueueDelete(e.queue, false, false, false)
			ch.ExchangeDelete(e.exchange, false, false)
		}
	})
}

// relayEnv is the environment a relayd process of this test runs with.
func (e *env) relayEnv(extra ...string) []string {
	base := []string{
		"PATH=" + os.Getenv("PATH"),
		"RELAY_DATABASE_URL=" + e.dbURL,
		"RELAY_NATS_URL=" + e.natsURL,
		"RELAY_AMQP_URL=" + e.amqpURL,
		"RELAY_OUTBOX_TABLE=" + e.table.String(),
		"RELAY_NATS_STREAM=" + e.stream,
		"RELAY_NATS_SUBJECT_PREFIX=" + e.prefix,
		"RELAY_AMQP_EXCHANGE=" + e.exchange,
		"RELAY_METRICS_ADDR=127.0.0.1:0",
		"RELAY_POLL_INTERVAL=200ms",
		"RELAY_LOG_LEVEL=debug",
	}
	return append(base, extra...)
}

// proc is a relayd process started by a test.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *testenv.SyncBuffer
	done chan struct{}
	err  error
}

// startUnready starts `relayd run` without waiting for it to start.
func (e *env) startUnready(name string, extra ...string) *proc {
	e.t.Helper()
	return startProc(e.t, name, e.relayEnv(extra...), nil, "run")
}

// startProc starts relayd with args in env, its log (stderr) in p.out and
// its stdout in stdout (nil: in p.out too); the test's end kills it.
func startProc(t *testing.T, name string, env []string, stdout *testenv.SyncBuffer, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(relaydBin, args...)
	cmd.Env = env
	return startExec(t, name, cmd, stdout)
}

// startExec is startProc for any command, with its Dir and Env set by the
// caller: for a process that is not relayd, such as an example consumer.
func startExec(t *testing.T, name string, cmd *exec.Cmd, stdout *testenv.SyncBuffer) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: cmd, out: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if stdout != nil {
		p.cmd.Stdout = stdout
	}
	dieWithTest(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.out.String())
		}
	})
	return p
}

// startRelay starts `relayd run` and waits until it says it is running.
func (e *env) startRelay(name string, extra ...string) *proc {
	e.t.Helper()
	p := e.startUnready(name, extra...)
	testenv.Eventually(e.t, 30*time.Second, func() bool {
		select {
		case <-p.done:
			e.t.Fatalf("%s exited at start: %v\n%s", name, p.err, p.out.String())
		default:
		}
		return strings.Contains(p.out.String(), "relay started")
	}, "%s did not start", name)
	return p
}

func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop(timeout time.Duration) int {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %v of SIGTERM", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// pending is a FROM item of the rows not recorded delivered: the outbox's,
// with a fresh row's state (tried and delivered nowhere), and the owed
// table's with theirs. A row moved by a batch is in one or the other in a
// query's snapshot.
func pending(table schema.Table) string {
	return `(SELECT id, message_id, topic, key, payload, headers,
		NULL::timestamptz AS amqp_delivered_at, 0 AS amqp_attempts, NULL::timestamptz AS amqp_parked_at, NULL::text AS amqp_last_error,
		NULL::timestamptz AS nats_delivered_at, 0 AS nats_attempts, NULL::timestamptz AS nats_parked_at, NULL::text AS nats_last_error,
		NULL::timestamptz AS done_at FROM ` + table.Ident() + `
	UNION ALL SELECT id, message_id, topic, key, payload, headers,
		amqp_delivered_at, amqp_attempts, amqp_parked_at, amqp_last_error,
		nats_delivered_at, nats_attempts, nats_parked_at, nats_last_error,
		done_at FROM ` + table.Owed() + `) pending`
}

// counts returns how many rows are committed, and delivered to each target:
// rows still to deliver (pending) and rows recorded in the delivered table
// (delivered to every target).
func (e *env) counts() (total, amqpN, natsN int) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(), `SELECT count(*), count(amqp_delivered_at), count(nats_delivered_at) FROM (
		SELECT amqp_delivered_at, nats_delivered_at FROM `+pending(e.table)+`
		UNION ALL SELECT amqp_delivered_at, nats_delivered_at FROM `+e.table.Delivered()+`) r`).
		Scan(&total, &amqpN, &natsN)
	if err != nil {
		e.t.Fatalf("count rows: %v", err)
	}
	return
}

// committedIDs returns the message ids of every committed row: pending or
// recorded delivered.
func (e *env) committedIDs() map[string]bool {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT message_id::text FROM `+pending(e.table)+`
		UNION ALL SELECT message_id::text FROM `+e.table.Delivered())
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids[id] = true
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// idCounts is how many times a test's consumer handled each id, read from
// the table it records that in (message_id, n).
func (e *env) idCounts(table string) map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT message_id, n FROM `+table)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// waitDelivered waits until every row in the table is delivered to both
// brokers.
func (e *env) waitDelivered(timeout time.Duration) {
	e.t.Helper()
	var total, a, n int
	testenv.Eventually(e.t, timeout, func() bool {
		total, a, n = e.counts()
		return a == total && n == total
	}, "rows not all delivered")
}

// streamIDs reads the whole stream and counts each Nats-Msg-Id.
func (e *env) streamIDs() map[string]int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	want := int(info.State.Msgs)
	ids := make(map[string]int, want)
	if want == 0 {
		return ids
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	got := 0
	for got < want {
		batch, err := c.Fetch(min(1000, want-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			e.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			ids[m.Headers().Get("Nats-Msg-Id")]++
			n++
		}
		if batch.Error() != nil {
			e.t.Fatalf("read stream: %v", batch.Error())
		}
		if n == 0 {
			e.t.Fatalf("read stream: got %d of %d messages", got, want)
		}
		got += n
	}
	return ids
}

// queueIDs drains the test's queue and counts each message-id. It reads
// until the queue has been empty for quiet.
func (e *env) queueIDs(quiet time.Duration) map[string]int {
	e.t.Helper()
	ch, err := e.amqpConn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Qos(1000, 0, false); err != nil {
		e.t.Fatal(err)
	}
	deliveries, err := ch.Consume(e.queue, "", true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	// Quiet for a while and the queue empty: all read. A RabbitMQ loaded
	// by the whole suite can pause for more than quiet with most of a
	// large queue still to deliver (once, 713 of 40,327 read): while the
	// queue still holds messages, keep reading, for up to two minutes.
	inspect, err := e.amqpConn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer inspect.Close()
	ids := map[string]int{}
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	giveUp := time.Now().Add(2 * time.Minute)
	for {
		select {
		case d := <-deliveries:
			ids[d.MessageId]++
			timer.Reset(quiet)
		case <-timer.C:
			q, err := inspect.QueueDeclarePassive(e.queue, true, false, false, false, nil)
			if err != nil {
				e.t.Fatalf("inspect queue %s: %v", e.queue, err)
			}
			if q.Messages == 0 || time.Now().After(giveUp) {
				return ids
			}
			timer.Reset(quiet)
		}
	}
}

// checkExactlyOnce asserts that every committed row is in the stream once
// and in the queue once, and that nothing else is in either.
func (e *env) checkExactlyOnce(committed map[string]bool, allowAMQPDupes bool) (amqpDupes int) {
	e.t.Helper()
	stream := e.streamIDs()
	queue := e.queueIDs(time.Second)
	check := func(broker string, got map[string]int, allowDupes bool) int {
		missing, extra, dupes := tally(committed, got)
		if missing > 0 || extra > 0 || (dupes > 0 && !allowDupes) {
			e.t.Errorf("%s: %d committed rows, %d distinct ids received: %d missing, %d not committed (rolled back?), %d duplicates",
				broker, len(committed), len(got), missing, extra, dupes)
		}
		return dupes
	}
	check("jetstream", stream, false)
	return check("rabbitmq", queue, allowAMQPDupes)
}

// freePort returns a TCP port on loopback that was free a moment ago.
func freePort(t *testing.T) int { t.Helper(); return testenv.FreePort(t) }

// tally compares what a broker holds with the committed ids.
func tally(committed map[string]bool, got map[string]int) (missing, extra, dupes int) {
	for id := range committed {
		switch n := got[id]; {
		case n == 0:
			missing++
		case n > 1:
			dupes += n - 1
		}
	}
	for id := range got {
		if !committed[id] {
			extra++
		}
	}
	return missing, extra, dupes
}
