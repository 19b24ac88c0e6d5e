package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// producers writes total rows from n concurrent producers in transactions
// of 1–50 rows, rolling back one transaction in five. It returns the
// message ids of committed and of rolled-back rows. pace, when set, is slept
// between transactions (to spread writes over time).
func (e *env) producers(ctx context.Context, n, total int, pace time.Duration) (committed, rolledBack map[string]bool) {
	e.t.Helper()
	var mu sync.Mutex
	committed, rolledBack = map[string]bool{}, map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for p := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 42))
			left := total / n
			if p == 0 {
				left += total % n
			}
			for left > 0 && ctx.Err() == nil {
				size := min(left, 1+rng.IntN(50))
				left -= size
				msgs := make([]outbox.Message, size)
				for i := range msgs {
					msgs[i] = outbox.Message{
						Topic:   fmt.Sprintf("orders.p%d", p),
						Payload: []byte(fmt.Sprintf(`{"producer":%d,"left":%d}`, p, left+i)),
						Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
					}
				}
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				ids, err := e.writer.Write(ctx, tx, msgs...)
				if err != nil {
					tx.Rollback(ctx)
					errs <- err
					return
				}
				rollback := rng.IntN(5) == 0
				if rollback {
					err = tx.Rollback(ctx)
				} else {
					err = tx.Commit(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, id := range ids {
					if rollback {
						rolledBack[id] = true
					} else {
						committed[id] = true
					}
				}
				mu.Unlock()
				if pace > 0 {
					time.Sleep(pace) // pacing the load, not waiting for a result
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatalf("producer: %v", err)
	}
	return committed, rolledBack
}

// 50,000 rows from 8 concurrent producers, a fifth rolled back, while two
// relayd processes run: every committed row exactly once in the stream and
// once in the queue; no rolled-back row anywhere; both stop cleanly.
func TestConcurrentProducersTwoRelays(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r1 := e.startRelay("relay-1")
	r2 := e.startRelay("relay-2")

	committed, rolledBack := e.producers(context.Background(), 8, 50_000, 0)
	if len(rolledBack) == 0 || len(committed)+len(rolledBack) != 50_000 {
		t.Fatalf("producers wrote %d committed + %d rolled back rows, want 50000 with some rolled back", len(committed), len(rolledBack))
	}
	e.waitDelivered(2 * time.Minute)
	if got := e.committedIDs(); len(got) != len(committed) {
		t.Fatalf("table has %d rows, producers committed %d", len(got), len(committed))
	}
	// RabbitMQ gets no copy twice — unless a confirm came more than twice
	// RELAY_PUBLISH_TIMEOUT late (a RabbitMQ swamped by the whole suite on
	// two cores): the row is then retried, and the other relay may take it
	// and publish a second copy. The bound: both relays' rows in flight.
	dupes := e.checkExactlyOnce(committed, true)
	if slow := confirmTimedOut(r1, r2); dupes > 0 && !slow {
		t.Errorf("rabbitmq got %d duplicates, and no confirm outlived the publish timeout", dupes)
	} else if dupes > 2*defaultInFlight {
		t.Errorf("rabbitmq got %d duplicates, more than both relays' rows in flight (%d)", dupes, 2*defaultInFlight)
	} else if dupes > 0 {
		t.Logf("rabbitmq duplicates after confirms outlived the publish timeout: %d", dupes)
	}

	for _, r := range []*proc{r1, r2} {
		if code := r.stop(30 * time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", r.name, code)
		}
	}
	// Both instances did work: the load was shared.
	for _, r := range []*proc{r1, r2} {
		if !strings.Contains(r.out.String(), "relay started") {
			t.Errorf("%s never started", r.name)
		}
	}
}

// Two relayd processes, one of them with every RabbitMQ confirm arriving
// after its publish timeout (latency on the way back from RabbitMQ; its
// publishes arrive at once). Its rows are retried, but held back a further
// publish timeout, and each late confirm is recorded as the delivery when
// it comes: the other relay, retrying those rows, finds them delivered. No
// copy twice in RabbitMQ — unless RabbitMQ itself took longer than the
// margin (twice the timeout less the latency: 1.5 s) to confirm, as a
// RabbitMQ swamped by the whole suite on two cores can; the other relay's
// timeout is that margin, so it then says so ("amqp: no confirm").
func TestSlowConfirmsTwoRelays(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	px := newFaultProxy(t, "slow-confirms", hostOf(t, e.amqpURL))
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	slow := e.startRelay("relay-slow", "RELAY_AMQP_URL="+px.url(e.amqpURL), "RELAY_PUBLISH_TIMEOUT=2s", "RELAY_METRICS_ADDR="+metrics)
	fast := e.startRelay("relay-fast", "RELAY_PUBLISH_TIMEOUT=1500ms")
	heal := px.inject("latency", map[string]any{"latency": 2500}, "downstream")
	defer heal()

	committed, _ := e.producers(context.Background(), 4, 4000, 5*time.Millisecond)
	e.waitDelivered(2 * time.Minute)
	if dupes := e.checkExactlyOnce(committed, true); dupes > 0 && !confirmTimedOut(fast) {
		t.Errorf("rabbitmq got %d duplicates, and RabbitMQ itself always confirmed within 1.5 s", dupes)
	} else if dupes > 2*defaultInFlight {
		t.Errorf("rabbitmq got %d duplicates, more than both relays' rows in flight (%d)", dupes, 2*defaultInFlight)
	} else if dupes > 0 {
		t.Logf("rabbitmq duplicates after RabbitMQ itself confirmed slower than 1.5 s: %d", dupes)
	}
	if !confirmTimedOut(slow) || !strings.Contains(slow.out.String(), "late confirms recorded") {
		t.Errorf("relay-slow recorded no late confirm: the test did not test it")
	}
	if late := scrape(t, metrics, "relayd_late_confirms_total")["amqp"]; late == 0 {
		t.Errorf("relayd_late_confirms_total{target=amqp} is 0 after late confirms")
	}
	for _, r := range []*proc{slow, fast} {
		if code := r.stop(30 * time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", r.name, code)
		}
	}
}

// One of two relayd processes SIGKILLed mid-run, while rows keep coming:
// nothing is lost, nothing is twice in the stream. RabbitMQ may see the
// in-flight rows of the killed relay again; that count is reported.
func TestSIGKILLMidRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r1 := e.startRelay("relay-1")
	r2 := e.startRelay("relay-2")

	var committed map[string]bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		committed, _ = e.producers(context.Background(), 4, 20_000, 2*time.Millisecond)
	}()
	// Kill relay-1 once a good part has flowed, so it dies mid-batch.
	testenv.Eventually(t, time.Minute, func() bool { _, _, n := e.counts(); return n > 3000 }, "no progress before kill")
	r1.kill()
	<-done
	e.waitDelivered(2 * time.Minute)
	dupes := e.checkExactlyOnce(committed, true)
	bound := defaultInFlight // the killed relay's batches in flight
	if confirmTimedOut(r1, r2) {
		bound = 2 * defaultInFlight // and the rows whose confirms came too late
	}
	t.Logf("rabbitmq duplicates after one SIGKILL: %d (bound: %d rows in flight, RELAY_WORKERS x RELAY_BATCH_SIZE per relay)", dupes, bound)
	if dupes > bound {
		t.Errorf("rabbitmq duplicates %d exceed the in-flight bound %d", dupes, bound)
	}
	if !r2.running() {
		t.Errorf("surviving relay exited:\n%s", r2.out.String())
	}
}

// startNATS runs a JetStream server of the test's own on port (0: any),
// storing in dir, so the test can stop it without touching shared services.
func startNATS(t *testing.T, port int, dir string) *natsserver.Server {
	t.Helper()
	return testenv.NATSServer(t, &natsserver.Options{Port: port, JetStream: true, StoreDir: dir})
}

// NATS unreachable for 20 s mid-run: relayd stays up, RabbitMQ deliveries go
// on, nothing is marked delivered to NATS meanwhile, and every row reaches
// the stream once NATS is back.
func TestNATSOutage(t *testing.T) {
	t.Parallel()
	port, dir := freePort(t), t.TempDir()
	ns := startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	e := newEnv(t, fmt.Sprintf("nats://127.0.0.1:%d", port))
	r := e.startRelay("relay", "RELAY_PUBLISH_TIMEOUT=2s")

	ctx, stop := context.WithCancel(context.Background())
	var committed map[string]bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		committed, _ = e.producers(ctx, 2, 12_000, 20*time.Millisecond)
	}()
	testenv.Eventually(t, time.Minute, func() bool { _, _, n := e.counts(); return n > 500 }, "no progress before outage")

	ns.Shutdown()
	ns.WaitForShutdown()
	// A batch whose PubAcks arrived just before the shutdown may still be
	// committing; after that nothing may be marked delivered to NATS.
	time.Sleep(2 * time.Second) // let that batch commit; a fixed grace, not a wait for a result
	_, amqpBefore, natsBefore := e.counts()
	outageEnd := time.Now().Add(18 * time.Second)
	for time.Now().Before(outageEnd) {
		if _, _, n := e.counts(); n != natsBefore {
			t.Fatalf("rows marked delivered to NATS while it was down: %d -> %d", natsBefore, n)
		}
		if !r.running() {
			t.Fatalf("relayd exited during the outage:\n%s", r.out.String())
		}
		time.Sleep(250 * time.Millisecond) // sampling interval of the outage window
	}
	total, amqpAfter, _ := e.counts()
	if amqpAfter <= amqpBefore {
		t.Errorf("rabbitmq made no progress while NATS was down (%d -> %d of %d)", amqpBefore, amqpAfter, total)
	}

	ns = startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	stop()
	<-done
	e.waitDelivered(2 * time.Minute)
	e.checkExactlyOnce(committed, false)
	if !r.running() {
		t.Fatalf("relayd exited:\n%s", r.out.String())
	}
}

// A topic RabbitMQ cannot route is returned, and so never recorded as
// delivered to RabbitMQ (while NATS gets it); once a binding exists, the
// retry delivers it.
func TestUnroutableIsNotDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startRelay("relay")
	ctx := context.Background()
	ids, err := e.writer.Write(ctx, e.pool, outbox.Message{Topic: "unbound.thing", Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	var attempts int
	var amqpDelivered, natsDelivered bool
	var lastErr *string
	q := `SELECT amqp_attempts, amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL, amqp_last_error FROM ` + pending(e.table) + ` WHERE message_id = $1`
	testenv.Eventually(t, 30*time.Second, func() bool {
		if err := e.pool.QueryRow(ctx, q, ids[0]).Scan(&attempts, &amqpDelivered, &natsDelivered, &lastErr); err != nil {
			t.Fatal(err)
		}
		return attempts >= 2 && natsDelivered
	}, "row not attempted twice on amqp / not delivered to nats")
	if amqpDelivered {
		t.Fatal("unroutable row recorded as delivered to RabbitMQ")
	}
	if lastErr == nil || !strings.Contains(*lastErr, "NO_ROUTE") {
		t.Fatalf("amqp_last_error = %v, want it to name NO_ROUTE", lastErr)
	}

	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.QueueBind(e.queue, "unbound.#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	// Delivered to both now: the row leaves the owed table for the
	// delivered table.
	testenv.Eventually(t, 30*time.Second, func() bool {
		err := e.pool.QueryRow(ctx, `SELECT amqp_delivered_at IS NOT NULL FROM `+e.table.Delivered()+` WHERE message_id = $1`, ids[0]).Scan(&amqpDelivered)
		return err == nil && amqpDelivered
	}, "row not delivered after the binding was added")
	if got := e.queueIDs(500 * time.Millisecond); got[ids[0]] != 1 {
		t.Fatalf("queue has the row %d times, want 1", got[ids[0]])
	}
}

// An idle relay publishes a new row to both brokers within milliseconds: the
// NOTIFY wakes it (the poll interval here is 10 s).
func TestIdleLatency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startRelay("relay", "RELAY_POLL_INTERVAL=10s")
	ctx := context.Background()

	gotNATS := make(chan string, 64)
	cons, err := e.js.OrderedConsumer(ctx, e.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { gotNATS <- m.Headers().Get("Nats-Msg-Id") })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	deliveries, err := ch.Consume(e.queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	var lat []time.Duration
	for i := range 20 {
		start := time.Now()
		ids, err := e.writer.Write(ctx, e.pool, outbox.Message{Topic: "test.latency", Payload: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		var n, a bool
		deadline := time.After(5 * time.Second)
		for !n || !a {
			select {
			case id := <-gotNATS:
				n = n || id == ids[0]
			case d := <-deliveries:
				a = a || d.MessageId == ids[0]
			case <-deadline:
				t.Fatalf("row %d not on both brokers after 5s (nats %v, amqp %v)", i, n, a)
			}
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	median := (lat[9] + lat[10]) / 2
	t.Logf("idle relay, commit to both brokers: median %v, max %v (n=20)", median, lat[19])
	if median >= 100*time.Millisecond {
		t.Fatalf("median latency %v, want < 100ms", median)
	}
}

// Bad configuration: exit status 2 and one line naming the variable.
func TestConfigErrorsExit2(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"bogus targets", []string{"RELAY_DATABASE_URL=postgres://u:secret@127.0.0.1/db", "RELAY_TARGETS=bogus"}, "RELAY_TARGETS"},
		{"no database url", nil, "RELAY_DATABASE_URL"},
		{"bad GOMAXPROCS", []string{"RELAY_DATABASE_URL=postgres://u:secret@127.0.0.1/db", "GOMAXPROCS=two"}, "GOMAXPROCS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(relaydBin, "run")
			cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, tc.env...) // nothing inherited
			out, err := cmd.CombinedOutput()
			if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 {
				t.Fatalf("exit = %v, want status 2; output:\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("output %q: want one line naming %s", out, tc.want)
			}
			if strings.Contains(string(out), "secret") {
				t.Fatalf("output leaks the password: %q", out)
			}
		})
	}
}

// Postgres drops every relay connection, again and again, mid-run (what a
// restart or failover looks like from relayd): it reconnects by itself, loses
// nothing and puts nothing twice in the stream.
func TestPostgresConnectionsKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	app := testenv.Name("relayd")
	url := e.dbURL + "&application_name=" + app
	if !strings.Contains(e.dbURL, "?") {
		url = e.dbURL + "?application_name=" + app
	}
	r := e.startRelay("relay", "RELAY_DATABASE_URL="+url)

	var committed map[string]bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		committed, _ = e.producers(context.Background(), 2, 10_000, 5*time.Millisecond)
	}()
	ctx := context.Background()
	killed := 0
	for i := 0; i < 10; i++ {
		testenv.Eventually(t, 30*time.Second, func() bool {
			var n int
			e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
			return n > 0
		}, "relay did not reconnect to postgres")
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		killed += n
		time.Sleep(300 * time.Millisecond) // spacing between fault injections
	}
	<-done
	e.waitDelivered(2 * time.Minute)
	dupes := e.checkExactlyOnce(committed, true)
	t.Logf("terminated %d relay backends in 10 rounds; rabbitmq duplicates: %d", killed, dupes)
	if killed < 10 {
		t.Errorf("only %d backends terminated, the fault was not injected", killed)
	}
	if !r.running() {
		t.Fatalf("relayd exited:\n%s", r.out.String())
	}
}

// At start relayd checks that the stream and the exchange exist and names
// the missing one; RELAY_PROVISION=true creates them (and the table) instead.
func TestStartupChecksAndProvision(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	missing := testenv.Name("missing")
	for _, tc := range []struct {
		name, env, want string
	}{
		{"stream", "RELAY_NATS_STREAM=" + strings.ToUpper(missing), strings.ToUpper(missing)},
		{"exchange", "RELAY_AMQP_EXCHANGE=" + missing, missing},
	} {
		cmd := exec.Command(relaydBin, "run")
		cmd.Env = e.relayEnv(tc.env)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), tc.name+` \"`) ||
			!strings.Contains(string(out), "does not exist") {
			t.Errorf("missing %s: exit %d, output %q; want exit 1 naming it", tc.name, cmd.ProcessState.ExitCode(), out)
		}
	}

	// Provision everything from nothing: a new schema, stream and exchange.
	stream, exchange := strings.ToUpper(testenv.Name("prov")), testenv.Name("prov")
	table := testenv.Name("t") + ".events"
	t.Cleanup(func() {
		e.js.DeleteStream(context.Background(), stream)
		if ch, err := e.amqpConn.Channel(); err == nil {
			ch.ExchangeDelete(exchange, false, false)
			ch.Close()
		}
		e.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+strings.Split(table, ".")[0]+`" CASCADE`)
	})
	r := e.startRelay("provisioned", "RELAY_PROVISION=true", "RELAY_NATS_STREAM="+stream, "RELAY_AMQP_EXCHANGE="+exchange,
		"RELAY_OUTBOX_TABLE="+table, "RELAY_NATS_SUBJECT_PREFIX="+strings.ToLower(stream)+".")
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+table+` (topic, payload) VALUES ('orders.created', '\x7b7d')`); err != nil {
		t.Fatalf("provisioned table: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		// In the owed table while RabbitMQ owes it (nothing is bound to the
		// new exchange), in the delivered table once both have it.
		e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+table+`_owed WHERE nats_delivered_at IS NOT NULL)
			+ (SELECT count(*) FROM `+table+`_delivered WHERE nats_delivered_at IS NOT NULL)`).Scan(&n)
		return n == 1
	}, "row not delivered to the provisioned stream")
	info, err := e.js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("provisioned stream: %v", err)
	}
	if cfg := info.CachedInfo().Config; cfg.Storage != jetstream.FileStorage || cfg.Duplicates != 2*time.Minute {
		t.Errorf("provisioned stream: storage %v duplicates %v; want file storage, 2m window", cfg.Storage, cfg.Duplicates)
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclarePassive(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Errorf("provisioned exchange: %v", err)
	}
	if code := r.stop(30 * time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
}

// defaultInFlight is the most rows one relay has in flight at default
// settings: RELAY_WORKERS × RELAY_BATCH_SIZE.
const defaultInFlight = 8 * 500

// confirmTimedOut reports whether any of the relays logged a RabbitMQ
// confirm that outlived RELAY_PUBLISH_TIMEOUT.
func confirmTimedOut(ps ...*proc) bool {
	for _, p := range ps {
		if strings.Contains(p.out.String(), "amqp: no confirm") {
			return true
		}
	}
	return false
}
