package integration

// The fault-injection suite: relayd processes SIGKILLed at random moments
// under load, and the network between relayd and each of the three services
// made slow, cut, blackholed and stalled through a toxiproxy proxy of the test's own
// (in-process; the shared services are never touched). After every fault
// every message is checked: each committed row once in the stream by
// Nats-Msg-Id, at least once in the queue, nothing else in either, and
// RabbitMQ's duplicates within the bound of docs/design.md, "Never re-sent to
// a broker that confirmed it".

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// The relay settings the fault tests run with, and the RabbitMQ duplicate
// bound they imply: the rows one process has in flight.
const (
	faultWorkers   = 4
	faultBatchSize = 500
	inFlightBound  = faultWorkers * faultBatchSize
)

// faultSoak reports whether the longer variants were asked for.
func faultSoak() bool { return os.Getenv("RELAY_TEST_SOAK") == "1" }

// faultSeed is the seed of a test's random choices: RELAY_TEST_SEED when
// set (to replay a failure), else the clock. It is logged.
func faultSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RELAY_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RELAY_TEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with RELAY_TEST_SEED=%d)", seed, seed)
	return seed
}

// startFaultRelay starts relayd with the fault tests' settings. If the test
// fails while the process still runs, it is sent SIGQUIT first, so its
// goroutine dump lands in the output that startRelay logs.
func startFaultRelay(e *env, name string, extra ...string) *proc {
	e.t.Helper()
	base := []string{
		"RELAY_WORKERS=" + strconv.Itoa(faultWorkers),
		"RELAY_BATCH_SIZE=" + strconv.Itoa(faultBatchSize),
		"GOTRACEBACK=all",
	}
	p := e.startRelay(name, append(base, extra...)...)
	e.t.Cleanup(func() {
		if !e.t.Failed() || !p.running() {
			return
		}
		p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	})
	return p
}

// faultLoad writes rows from several producers in transactions of 1–maxTx
// rows, one transaction in five rolled back, and keeps the ids it
// committed.
type faultLoad struct {
	e         *env
	remaining atomic.Int64 // rows still to commit; < 0: no limit
	written   atomic.Int64 // rows committed so far
	stop      chan struct{}
	halt      sync.Once
	done      chan struct{}

	mu        sync.Mutex
	committed map[string]bool
	err       error
}

// startFaultLoad starts n producers that commit total rows (0: until halt),
// sleeping pace between transactions.
func startFaultLoad(e *env, n, total, maxTx int, pace time.Duration, seed uint64) *faultLoad {
	l := &faultLoad{e: e, stop: make(chan struct{}), done: make(chan struct{}), committed: map[string]bool{}}
	l.remaining.Store(int64(total))
	if total == 0 {
		l.remaining.Store(-1)
	}
	var wg sync.WaitGroup
	for p := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.produce(p, maxTx, pace, rand.New(rand.NewPCG(seed, uint64(p)))); err != nil {
				l.mu.Lock()
				l.err = err
				l.mu.Unlock()
			}
		}()
	}
	go func() { wg.Wait(); close(l.done) }()
	e.t.Cleanup(func() { l.halt.Do(func() { close(l.stop) }); <-l.done }) // a failed test leaves no producer behind
	return l
}

// reserve takes up to want rows from the remaining budget.
func (l *faultLoad) reserve(want int) int {
	for {
		left := l.remaining.Load()
		if left < 0 {
			return want
		}
		n := min(int64(want), left)
		if n == 0 || l.remaining.CompareAndSwap(left, left-n) {
			return int(n)
		}
	}
}

func (l *faultLoad) produce(p, maxTx int, pace time.Duration, rng *rand.Rand) error {
	ctx := context.Background() // a transaction is never cut short; halt stops between them
	for seq := 0; ; seq++ {
		select {
		case <-l.stop:
			return nil
		default:
		}
		size := 1 + rng.IntN(maxTx)
		rollback := rng.IntN(5) == 0
		if !rollback {
			if size = l.reserve(size); size == 0 {
				return nil
			}
		}
		msgs := make([]outbox.Message, size)
		for i := range msgs {
			msgs[i] = outbox.Message{
				Topic:   fmt.Sprintf("orders.p%d", p),
				Payload: []byte(fmt.Sprintf(`{"producer":%d,"tx":%d,"i":%d}`, p, seq, i)),
				Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			}
		}
		tx, err := l.e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		ids, err := l.e.writer.Write(ctx, tx, msgs...)
		if err != nil {
			tx.Rollback(ctx)
			return err
		}
		if rollback {
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
		} else {
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			l.mu.Lock()
			for _, id := range ids {
				l.committed[id] = true
			}
			l.mu.Unlock()
			l.written.Add(int64(len(ids)))
		}
		if pace > 0 {
			time.Sleep(pace) // pacing the load, not waiting for a result
		}
	}
}

// wait waits for the producers to finish (halting them first if they run
// without a limit) and returns the committed ids.
func (l *faultLoad) wait() map[string]bool {
	l.e.t.Helper()
	if l.remaining.Load() < 0 {
		l.halt.Do(func() { close(l.stop) })
	}
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		l.e.t.Fatalf("producer: %v", l.err)
	}
	return l.committed
}

// 100,000 committed rows (and a quarter as many rolled back) written by 8
// producers while two relayd processes run; 10 times a random one of them
// is SIGKILLed at a random point of the write and restarted at once. Nothing
// is lost on either broker, nothing is twice in the stream, and RabbitMQ's
// duplicates stay within kills x RELAY_WORKERS x RELAY_BATCH_SIZE.
// RELAY_TEST_SOAK=1: 1,000,000 rows and 50 kills (give go test -timeout 60m).
//
// Not parallel: it saturates both cores of the CI machine for most of its
// run, which would skew the latency assertions of tests beside it.
func TestCrashChaos(t *testing.T) {
	rows, kills := 100_000, 10
	if faultSoak() {
		rows, kills = 1_000_000, 50
	}
	rng := rand.New(rand.NewPCG(faultSeed(t), 1))
	e := newEnv(t)
	relays := []*proc{startFaultRelay(e, "relay-1"), startFaultRelay(e, "relay-2")}

	// The kills happen when the write passes random points between 5% and
	// 95% of the rows.
	marks := make([]int64, kills)
	for i := range marks {
		marks[i] = int64(float64(rows) * (0.05 + 0.9*rng.Float64()))
	}
	slices.Sort(marks)

	start := time.Now()
	load := startFaultLoad(e, 8, rows, 50, 0, rng.Uint64())
	duringWrite := 0
	for i, mark := range marks {
		testenv.Eventually(t, 2*time.Minute, func() bool { return load.written.Load() >= mark }, "producers stuck below %d rows", mark)
		k := rng.IntN(len(relays))
		written := load.written.Load()
		select {
		case <-load.done:
		default:
			duringWrite++
		}
		_, a, n := e.counts()
		t.Logf("kill %d: SIGKILL %s at %v: %d rows committed, %d delivered to amqp, %d to nats", i+1, relays[k].name,
			time.Since(start).Round(time.Millisecond), written, a, n)
		relays[k].kill()
		relays[k] = startFaultRelay(e, fmt.Sprintf("relay-%d.%d", k+1, i+1))
	}
	committed := load.wait()
	wrote := time.Since(start)
	e.waitDelivered(time.Duration(rows/100_000) * 3 * time.Minute)
	drained := time.Since(start)

	if len(committed) != rows {
		t.Fatalf("producers committed %d rows, want %d", len(committed), rows)
	}
	if got := e.committedIDs(); len(got) != rows {
		t.Fatalf("table has %d rows, producers committed %d", len(got), rows)
	}
	dupes := e.checkExactlyOnce(committed, true)
	bound := kills * inFlightBound
	t.Logf("%d rows, %d SIGKILLs (%d while producers were writing): written in %v, all delivered after %v; "+
		"0 lost, 0 stream duplicates; rabbitmq duplicates %d (bound %d = %d kills x %d workers x %d rows)",
		rows, kills, duringWrite, wrote.Round(time.Millisecond), drained.Round(time.Millisecond), dupes, bound, kills, faultWorkers, faultBatchSize)
	if dupes > bound {
		t.Errorf("rabbitmq duplicates %d exceed the bound %d", dupes, bound)
	}
	for _, r := range relays {
		if !r.running() {
			t.Errorf("%s exited:\n%s", r.name, r.out.String())
		}
	}
}

// faultProxy is a toxiproxy proxy of the test's own, in process, in front of
// one service.
type faultProxy struct {
	t     *testing.T
	proxy *toxiproxy.Proxy
}

// quietToxics silences toxiproxy's toxics, which log at trace level (the
// bandwidth toxic a line every 100 ms while it holds data) through zerolog's
// global logger; nothing else in this package logs through zerolog.
var quietToxics sync.Once

func newFaultProxy(t *testing.T, name, upstream string) *faultProxy {
	t.Helper()
	quietToxics.Do(func() { zerolog.SetGlobalLevel(zerolog.InfoLevel) })
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("proxy for %s: %v", name, err)
	}
	t.Cleanup(p.Stop)
	return &faultProxy{t: t, proxy: p}
}

// url returns rawURL with its host replaced by the proxy's address.
func (f *faultProxy) url(rawURL string) string {
	f.t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		f.t.Fatal(err)
	}
	u.Host = f.proxy.Listen
	return u.String()
}

// inject adds a toxic on each given stream ("upstream": relayd to the
// service, "downstream": back) and returns a function that removes them.
// Connections opened while it is in place get it too.
func (f *faultProxy) inject(typ string, attrs map[string]any, streams ...string) (heal func()) {
	f.t.Helper()
	var names []string
	for _, s := range streams {
		name := typ + "_" + s
		b, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": s, "attributes": attrs})
		if err != nil {
			f.t.Fatal(err)
		}
		if _, err := f.proxy.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
			f.t.Fatalf("add toxic %s: %v", name, err)
		}
		names = append(names, name)
	}
	return func() {
		for _, name := range names {
			if err := f.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
				f.t.Errorf("remove toxic %s: %v", name, err)
			}
		}
	}
}

// The services a fault can be put in front of, with the relayd variable that
// points at it and what relayd logs when it loses a connection to it.
type faultService struct {
	name    string // subtest name
	envVar  string
	url     func(*env) string
	lostLog []string // any of these in relayd's output shows a connection was lost
	target  string   // the delivery target it carries, or "" (Postgres carries both)
}

var faultServices = []faultService{
	{name: "postgres", envVar: "RELAY_DATABASE_URL", url: func(e *env) string { return e.dbURL },
		lostLog: []string{"relay batch failed", "listen failed"}},
	{name: "rabbitmq", envVar: "RELAY_AMQP_URL", url: func(e *env) string { return e.amqpURL },
		lostLog: []string{"amqp connection lost"}, target: "amqp"},
	{name: "nats", envVar: "RELAY_NATS_URL", url: func(e *env) string { return e.natsURL },
		lostLog: []string{"nats disconnected"}, target: "nats"},
}

// One network fault between relayd and one service, while rows flow.
type networkFault struct {
	name string
	// only restricts the fault to one service; "" means all.
	only string
	// maxDupes is the RabbitMQ duplicate bound: 0 when no connection that
	// carries confirms or records is lost, else the rows one process has
	// in flight.
	maxDupes func(s faultService) int
	inject   func(t *testing.T, f *faultRun)
}

// faultRun is one running fault test: its env, proxy, relay and load.
type faultRun struct {
	e       *env
	svc     faultService
	px      *faultProxy
	r       *proc
	app     string // relayd's application_name in pg_stat_activity
	metrics string // relayd's RELAY_METRICS_ADDR
	load    *faultLoad
}

// setupFault starts relayd with svc behind a proxy of the test's own and
// about 300 rows/s flowing (one producer, transactions of 1–10 rows every
// 15 ms), and returns once both brokers have received some.
func setupFault(t *testing.T, svc faultService) *faultRun {
	t.Helper()
	seed := faultSeed(t)
	e := newEnv(t)
	f := &faultRun{e: e, svc: svc, app: testenv.Name("relayd"), metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	f.px = newFaultProxy(t, svc.name, hostOf(t, svc.url(e)))
	dbURL := e.dbURL
	if svc.envVar == "RELAY_DATABASE_URL" {
		dbURL = f.px.url(dbURL)
	}
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	env := []string{"RELAY_DATABASE_URL=" + dbURL + sep + "application_name=" + f.app,
		"RELAY_PUBLISH_TIMEOUT=2s", "RELAY_METRICS_ADDR=" + f.metrics, "RELAY_STATS_INTERVAL=500ms"}
	if svc.envVar != "RELAY_DATABASE_URL" {
		env = append(env, svc.envVar+"="+f.px.url(svc.url(e)))
	}
	f.r = startFaultRelay(e, "relay", env...)
	f.load = startFaultLoad(e, 1, 0, 10, 15*time.Millisecond, seed)
	testenv.Eventually(t, 30*time.Second, func() bool { _, a, n := e.counts(); return a > 200 && n > 200 }, "no progress before the fault")
	return f
}

// midBatch returns at a moment when relayd has a batch in flight: rows
// claimed (its session idle in transaction) and their publishes awaiting
// confirms. It writes bursts of 2,000 rows so that full batches run back to
// back, and reports whether it caught one.
func (f *faultRun) midBatch(t *testing.T) bool {
	t.Helper()
	ctx := context.Background()
	for range 5 {
		msgs := make([]outbox.Message, 2000)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "orders.burst", Payload: []byte(fmt.Sprintf(`{"burst":%d}`, i))}
		}
		ids, err := f.e.writer.Write(ctx, f.e.pool, msgs...)
		if err != nil {
			t.Fatal(err)
		}
		f.load.mu.Lock()
		for _, id := range ids {
			f.load.committed[id] = true
		}
		f.load.mu.Unlock()
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			var n int
			if err := f.e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'`,
				f.app).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				return true
			}
			time.Sleep(2 * time.Millisecond) // polling interval
		}
	}
	return false
}

// lost counts relayd's log lines saying it lost a connection to the service.
func (f *faultRun) lost() int {
	out := f.r.out.String()
	n := 0
	for _, s := range f.svc.lostLog {
		n += strings.Count(out, s)
	}
	return n
}

// connLost: a connection to the service carrying confirms (RabbitMQ) or
// records (Postgres) may have been cut mid-batch.
func connLost(s faultService) int {
	if s.name == "nats" {
		return 0 // NATS failing never makes the relay re-send to RabbitMQ
	}
	return inFlightBound
}

func noDupes(faultService) int { return 0 }

var networkFaults = []networkFault{
	{name: "latency", maxDupes: noDupes, inject: injectLatency(100*time.Millisecond, 4*time.Second)},
	{name: "reset", maxDupes: connLost, inject: injectReset},
	// Bytes dropped for 20 s, connections left open ("timeout" 0); removing
	// the toxic closes them.
	{name: "blackhole", maxDupes: connLost, inject: injectOutage("timeout", map[string]any{"timeout": 0}, 20*time.Second)},
	// Bytes held for 10 s ("bandwidth" 0), then all let through: a partition
	// that heals without resetting connections, so what was sent during it
	// arrives late.
	{name: "stall", maxDupes: connLost, inject: injectOutage("bandwidth", map[string]any{"rate": 0}, 10*time.Second)},
	// A slow broker: confirms take a second (500 ms each way), within
	// RELAY_PUBLISH_TIMEOUT (2 s); every row still arrives. (A confirm later
	// than the timeout: the case below.)
	{name: "slow", only: "rabbitmq", maxDupes: connLost, inject: injectLatency(500*time.Millisecond, 6*time.Second)},
	// Slower than the timeout: confirms take 3 s (1.5 s each way) for 8 s.
	{name: "slower-than-timeout", only: "rabbitmq", maxDupes: connLost, inject: injectLatency(1500*time.Millisecond, 8*time.Second)},
}

// Every service (Postgres, RabbitMQ, NATS) behind a toxiproxy proxy, and
// every fault in turn while rows flow: latency, connections reset mid-batch,
// a 20 s blackhole, a 10 s stall, and a slow RabbitMQ. After each: 0 lost,
// 0 duplicates in the stream, RabbitMQ duplicates within the fault's bound,
// relayd still running and caught up by itself, /readyz 200.
func TestNetworkFaults(t *testing.T) {
	t.Parallel()
	for _, svc := range faultServices {
		for _, nf := range networkFaults {
			if nf.only != "" && nf.only != svc.name {
				continue
			}
			t.Run(svc.name+"/"+nf.name, func(t *testing.T) {
				t.Parallel()
				runNetworkFault(t, svc, nf)
			})
		}
	}
}

func runNetworkFault(t *testing.T, svc faultService, nf networkFault) {
	f := setupFault(t, svc)
	e := f.e
	nf.inject(t, f)
	healed := time.Now()

	time.Sleep(2 * time.Second) // rows keep coming for a while after the fault: pacing, not a wait for a result
	committed := f.load.wait()
	e.waitDelivered(90 * time.Second)
	recovered := time.Since(healed)

	if !f.r.running() {
		t.Fatalf("relayd exited:\n%s", f.r.out.String())
	}
	testenv.Eventually(t, 15*time.Second, func() bool { code, _ := readyz(f.metrics); return code == 200 }, "/readyz did not recover")
	if got := e.committedIDs(); len(got) != len(committed) {
		t.Fatalf("table has %d rows, producers committed %d", len(got), len(committed))
	}
	dupes := e.checkExactlyOnce(committed, true)
	bound := nf.maxDupes(svc)
	t.Logf("%s %s: %d rows, all delivered %v after the fault ended; failed publishes (retried): %v; "+
		"jetstream dropped %.0f repeats; rabbitmq duplicates %d (bound %d)",
		svc.name, nf.name, len(committed), recovered.Round(time.Millisecond), scrape(t, f.metrics, "relayd_publish_errors_total"),
		scrape(t, f.metrics, "relayd_duplicates_total")[""], dupes, bound)
	if dupes > bound {
		t.Errorf("rabbitmq duplicates %d exceed the bound %d for a %s fault on %s", dupes, bound, nf.name, svc.name)
	}
}

func hostOf(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// injectLatency delays every byte both ways by d for hold: both brokers
// keep getting rows meanwhile.
func injectLatency(d, hold time.Duration) func(*testing.T, *faultRun) {
	return func(t *testing.T, f *faultRun) {
		_, a0, n0 := f.e.counts()
		heal := f.px.inject("latency", map[string]any{"latency": d.Milliseconds()}, "upstream", "downstream")
		end := time.Now().Add(hold)
		for time.Now().Before(end) {
			if !f.r.running() {
				heal()
				t.Fatalf("relayd exited under latency:\n%s", f.r.out.String())
			}
			time.Sleep(250 * time.Millisecond) // sampling interval of the fault window
		}
		_, a1, n1 := f.e.counts()
		heal()
		t.Logf("during %v of %v latency each way: amqp %d -> %d, nats %d -> %d delivered", hold, d, a0, a1, n0, n1)
		if a1 <= a0 || n1 <= n0 {
			t.Errorf("no progress under %v latency: amqp %d -> %d, nats %d -> %d", d, a0, a1, n0, n1)
		}
	}
}

// injectReset cuts every connection to the service that carries data, at a
// moment when a batch is in flight, and for 1.5 s after (reconnects
// meanwhile are cut too).
func injectReset(t *testing.T, f *faultRun) {
	before := f.lost()
	mid := f.midBatch(t)
	heal := f.px.inject("reset_peer", map[string]any{"timeout": 0}, "downstream")
	testenv.Eventually(t, 10*time.Second, func() bool { return f.lost() > before }, "relayd did not see its %s connection cut", f.svc.name)
	time.Sleep(1500 * time.Millisecond) // how long the connections keep being cut
	heal()
	t.Logf("reset %s connections (batch in flight: %v): relayd logged %d connection losses", f.svc.name, mid, f.lost()-before)
}

// injectOutage applies the toxic typ both ways for outage, starting while a
// batch is in flight, then removes it. With a broker cut off the other
// broker keeps getting rows and, after a grace of one publish timeout,
// nothing more is marked delivered to the one cut off.
func injectOutage(typ string, attrs map[string]any, outage time.Duration) func(*testing.T, *faultRun) {
	return func(t *testing.T, f *faultRun) {
		mid := f.midBatch(t)
		before := f.lost()
		heal := f.px.inject(typ, attrs, "upstream", "downstream")
		start := time.Now()
		defer func() {
			if heal != nil {
				heal()
			}
		}()
		// A batch whose confirms arrived just before may still be recording;
		// anything published later waits out RELAY_PUBLISH_TIMEOUT (2 s).
		time.Sleep(3 * time.Second) // a fixed grace, not a wait for a result
		_, a0, n0 := f.e.counts()
		ready := map[int]int{}
		for time.Since(start) < outage {
			if !f.r.running() {
				t.Fatalf("relayd exited during the %s:\n%s", typ, f.r.out.String())
			}
			code, _ := readyz(f.metrics)
			ready[code]++
			_, a, n := f.e.counts()
			switch f.svc.target {
			case "amqp":
				if a != a0 {
					t.Fatalf("rows marked delivered to RabbitMQ while it was cut off: %d -> %d", a0, a)
				}
			case "nats":
				if n != n0 {
					t.Fatalf("rows marked delivered to NATS while it was cut off: %d -> %d", n0, n)
				}
			}
			time.Sleep(250 * time.Millisecond) // sampling interval of the fault window
		}
		total, a1, n1 := f.e.counts()
		heal()
		heal = nil
		t.Logf("%s of %s for %v (began with a batch in flight: %v): delivered amqp %d -> %d, nats %d -> %d of %d rows "+
			"(from %v in); /readyz answers %v; connection losses logged %d",
			typ, f.svc.name, outage, mid, a0, a1, n0, n1, total, 3*time.Second, ready, f.lost()-before)
		switch f.svc.target {
		case "amqp":
			if n1 <= n0 {
				t.Errorf("nats made no progress while RabbitMQ was cut off (%d -> %d)", n0, n1)
			}
		case "nats":
			if a1 <= a0 {
				t.Errorf("rabbitmq made no progress while NATS was cut off (%d -> %d)", a0, a1)
			}
		}
	}
}

// /readyz answers 503 naming the service within 10 s of it being
// blackholed (relayd itself pauses an unreachable broker after one
// RELAY_PUBLISH_TIMEOUT, 2 s here), and 200 again once it is back; nothing
// is lost meanwhile.
func TestReadyzFollowsBlackhole(t *testing.T) {
	t.Parallel()
	for _, svc := range faultServices {
		t.Run(svc.name, func(t *testing.T) {
			t.Parallel()
			f := setupFault(t, svc)
			name := svc.target
			if name == "" {
				name = "postgres"
			}
			heal := f.px.inject("timeout", map[string]any{"timeout": 0}, "upstream", "downstream")
			start := time.Now()
			var code int
			var body string
			for code, body = readyz(f.metrics); code != 503 || !strings.Contains(body, name); code, body = readyz(f.metrics) {
				if time.Since(start) > 10*time.Second {
					heal()
					t.Fatalf("/readyz still answers %d %q 10s into a blackhole of %s", code, strings.TrimSpace(body), name)
				}
				time.Sleep(100 * time.Millisecond) // polling interval
			}
			failed := time.Since(start)
			heal()
			healed := time.Now()
			testenv.Eventually(t, 30*time.Second, func() bool { code, _ := readyz(f.metrics); return code == 200 }, "/readyz did not recover")
			t.Logf("/readyz: 503 %v after the blackhole began (%q), 200 %v after it ended",
				failed.Round(time.Millisecond), strings.TrimSpace(body), time.Since(healed).Round(time.Millisecond))
			committed := f.load.wait()
			f.e.waitDelivered(90 * time.Second)
			f.e.checkExactlyOnce(committed, true)
			if !f.r.running() {
				t.Fatalf("relayd exited:\n%s", f.r.out.String())
			}
		})
	}
}

// SIGTERM while Postgres does not answer (its bytes dropped, connections
// left open): relayd holds no rows — its claims are waiting — so it stops
// at once and exits 0. It used to wait for its claims' own deadline
// (RELAY_PUBLISH_TIMEOUT + 30 s), past RELAY_SHUTDOWN_TIMEOUT, and exit 1
// saying batches had not finished. Then a new relayd delivers every row.
func TestStopWhilePostgresDoesNotAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	px := newFaultProxy(t, "postgres", hostOf(t, e.dbURL))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r := e.startRelay("relay", "RELAY_DATABASE_URL="+px.url(e.dbURL), "RELAY_SHUTDOWN_TIMEOUT=20s", "RELAY_METRICS_ADDR="+addr)
	ctx := context.Background()
	write := func(n int) {
		for i := range n {
			if _, err := e.writer.Write(ctx, e.pool, outbox.Message{Topic: "test.stop", Payload: []byte{byte(i)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(20)
	e.waitDelivered(30 * time.Second)
	// A row Postgres shows delivered may belong to a batch still reading its
	// COMMIT's reply: cut then, it rightly waits. Each batch with rows counts
	// once it has returned: wait until that count has held for 300 ms.
	var last float64
	var since time.Time
	testenv.Eventually(t, 30*time.Second, func() bool {
		if n := batchesDone(t, addr); n != last || since.IsZero() {
			last, since = n, time.Now()
		}
		return last > 0 && time.Since(since) >= 300*time.Millisecond
	}, "the relay's batches did not settle")
	heal := px.inject("timeout", map[string]any{"timeout": 0}, "upstream", "downstream")
	// No rows meanwhile: a batch holding rows whose record cannot reach
	// Postgres rightly waits (and exits 1 past the timeout). Its polls
	// (every 200 ms) now hang, each in a claim or its empty commit.
	time.Sleep(time.Second) // every worker is now waiting on Postgres: pacing, not a wait for a result
	start := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // its exit is read below
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		// Not out within seconds: what it waits on is in its goroutines,
		// which Go prints on SIGQUIT.
		r.cmd.Process.Signal(syscall.SIGQUIT) //nolint:errcheck // best effort
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
		}
		heal()
		t.Fatalf("relayd did not exit within 10 s of SIGTERM with Postgres not answering; its goroutines at SIGQUIT:\n%s", r.out.String())
	}
	code, took := r.cmd.ProcessState.ExitCode(), time.Since(start)
	heal()
	if code != 0 {
		t.Fatalf("relayd exited %d %v after SIGTERM with Postgres not answering, want 0:\n%s", code, took.Round(time.Millisecond), r.out.String())
	}
	t.Logf("exited 0 in %v", took.Round(time.Millisecond))
	write(20)
	e.startRelay("relay2")
	e.waitDelivered(30 * time.Second)
	if total, _, _ := e.counts(); total != 40 {
		t.Fatalf("%d rows, want 40", total)
	}
}

// batchesDone is how many batches with rows the relay at addr has finished:
// its relayd_batch_duration_seconds count.
func batchesDone(t *testing.T, addr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	var n float64
	for _, m := range fams["relayd_batch_duration_seconds"].GetMetric() {
		n += float64(m.GetHistogram().GetSampleCount())
	}
	return n
}
