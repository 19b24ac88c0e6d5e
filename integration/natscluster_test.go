package integration

// The JetStream cluster tests (issue #31, section 1): relayd, the backfill
// and the cutover check against a 3-node cluster of the test's own
// (internal/testenv NATSCluster) and a stream with Replicas: 3, while the
// stream's leader or the meta leader goes away and comes back: shut down
// (embedded nodes; leadership is handed over first) or SIGKILLed (nodes as
// nats-server processes; nothing handed over). Every message is checked:
// each committed row once in the stream by Nats-Msg-Id, in the queue,
// nothing else in either.

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// newClusterEnv starts a 3-node JetStream cluster (embedded, or with bin
// one nats-server process per node) and a test env on it whose stream has
// Replicas: 3.
func newClusterEnv(t *testing.T, bin string) (*env, *testenv.NATSCluster) {
	t.Helper()
	var c *testenv.NATSCluster
	if bin == "" {
		c = testenv.NewNATSCluster(t, 3)
	} else {
		c = testenv.NewNATSClusterProcs(t, 3, bin)
	}
	e := newEnvNATS(t, c.URLs())
	// newEnv made the stream with one replica: make it again with three.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.js.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	testenv.CreateStream(t, ctx, e.js, jetstream.StreamConfig{
		Name: e.stream, Subjects: []string{e.prefix + ">"}, Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute, Replicas: 3,
	})
	c.WaitStreamCurrent(e.js, e.stream, 30*time.Second)
	return e, c
}

// stepDownStream asks the stream's leader to hand over, and waits until
// another node leads it with every replica current.
func stepDownStream(t *testing.T, e *env, c *testenv.NATSCluster, from int) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, err := e.nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+e.stream, nil, 2*time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream leader stepdown: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // between attempts
	}
	var leader int
	testenv.Eventually(t, 20*time.Second, func() bool {
		leader = c.WaitStreamCurrent(e.js, e.stream, 20*time.Second)
		return leader != from
	}, "stream %s still led by %s after a stepdown", e.stream, c.NodeName(from))
	return leader
}

// separateLeaders makes the stream's leader and the meta leader different
// nodes, so that each case loses only the one it names, and returns both.
func separateLeaders(t *testing.T, e *env, c *testenv.NATSCluster) (stream, meta int) {
	t.Helper()
	for range 5 {
		stream, meta = c.WaitStreamCurrent(e.js, e.stream, 20*time.Second), c.WaitMetaLeader(20*time.Second)
		if stream != meta {
			return stream, meta
		}
		stepDownStream(t, e, c, stream)
	}
	t.Fatalf("stream leader and meta leader still the same node (%s) after 5 stepdowns", c.NodeName(stream))
	return
}

// lagSample is one read of relayd_outbox_lag_seconds.
type lagSample struct {
	at         time.Time
	nats, amqp float64
}

// lagSampler reads relayd's lag gauges every 100 ms until stopped.
type lagSampler struct {
	mu      sync.Mutex
	samples []lagSample
	stop    chan struct{}
	done    chan struct{}
	stopFn  func() // stops the sampling and waits for it
}

func sampleLag(t *testing.T, addr string) *lagSampler {
	s := &lagSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			lag, err := readGauge(addr, "relayd_outbox_lag_seconds")
			if err != nil || len(lag) < 2 {
				continue // not serving yet: no sample
			}
			s.mu.Lock()
			s.samples = append(s.samples, lagSample{at: time.Now(), nats: lag["nats"], amqp: lag["amqp"]})
			s.mu.Unlock()
		}
	}()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(s.stop) }); <-s.done })
	s.stopFn = func() { once.Do(func() { close(s.stop) }); <-s.done }
	return s
}

// since returns the samples taken after t0.
func (s *lagSampler) since(t0 time.Time) []lagSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []lagSample
	for _, x := range s.samples {
		if x.at.After(t0) {
			out = append(out, x)
		}
	}
	return out
}

// readGauge reads one metric per target label from /metrics; unlike scrape
// it reports errors, so that a sampling goroutine can call it.
func readGauge(addr, name string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "target" {
				out[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out, nil
}

// lagFigures sums up the nats lag after t0: its peak, and how long after t0
// it was back under a second after that peak (0 if it never reached one).
func lagFigures(samples []lagSample, t0 time.Time) (peak float64, under1 time.Duration, amqpPeak float64) {
	peakAt := -1
	for i, s := range samples {
		if s.nats > peak {
			peak, peakAt = s.nats, i
		}
		amqpPeak = max(amqpPeak, s.amqp)
	}
	if peak < 1 || peakAt < 0 {
		return peak, 0, amqpPeak
	}
	for _, s := range samples[peakAt:] {
		if s.nats < 1 {
			return peak, s.at.Sub(t0), amqpPeak
		}
	}
	return peak, -1, amqpPeak
}

// maxCommittedID is the highest outbox id committed so far.
func (e *env) maxCommittedID() int64 {
	e.t.Helper()
	var id int64
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM (SELECT id FROM `+e.table.Ident()+
		` UNION ALL SELECT id FROM `+e.table.Owed()+` UNION ALL SELECT id FROM `+e.table.Delivered()+`) r`).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// firstNATSDeliveryAfter is when the first row with an id above id was
// recorded delivered to NATS (a PubAck for a message published after the
// moment id was read), or nil.
func (e *env) firstNATSDeliveryAfter(id int64) *time.Time {
	e.t.Helper()
	var at *time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT min(nats_delivered_at) FROM (SELECT id, nats_delivered_at FROM `+e.table.Owed()+
		` UNION ALL SELECT id, nats_delivered_at FROM `+e.table.Delivered()+`) r WHERE id > $1`, id).Scan(&at); err != nil {
		e.t.Fatal(err)
	}
	return at
}

// clusterStreamIDs is streamIDs for a cluster where a node has just come
// back: a read that fails (JetStream API requests can go unanswered for a
// moment, "no responders") is done again from the start, for up to 30 s.
func (e *env) clusterStreamIDs() map[string]int {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ids, err := e.readStream()
		if err == nil {
			return ids
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("read stream %s: %v", e.stream, err)
		}
		time.Sleep(100 * time.Millisecond) // between attempts
	}
}

// readStream reads the whole stream with an ordered consumer and counts each
// Nats-Msg-Id.
func (e *env) readStream() (map[string]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		return nil, err
	}
	want := int(s.CachedInfo().State.Msgs)
	ids := make(map[string]int, want)
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	for got := 0; got < want; {
		batch, err := c.Fetch(min(1000, want-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			ids[m.Headers().Get("Nats-Msg-Id")]++
			n++
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("got %d of %d messages", got, want)
		}
		got += n
	}
	return ids, nil
}

// Under a steady dual-write load, the stream's leader (cases stream-leader*)
// or the JetStream meta leader (cases meta-leader*), made different nodes
// first, of a 3-node cluster is shut down (or, cases *-kill, SIGKILLed)
// and, once the cluster goes on without it, started again on the same
// ports and store. relayd, given all three
// URLs, never exits; every committed row is in the R3 stream exactly once
// by Nats-Msg-Id and in the queue at least once (no RabbitMQ duplicates: a
// NATS fault never makes the relay re-send to RabbitMQ); the lag gauge,
// sampled every 100 ms, goes back to 0. Logged: rows, lost and duplicates
// per broker, the time from the shutdown to the first PubAck of a row
// written after it, the nats lag's peak and when it was back under 1 s. A
// killed stream leader must show on the gauge: a stall of 2 s or more, then
// back under 1 s.
func TestClusterLeaderLoss(t *testing.T) {
	t.Parallel()
	for _, which := range []string{"stream-leader", "stream-leader-kill", "meta-leader", "meta-leader-kill"} {
		t.Run(which, func(t *testing.T) {
			t.Parallel()
			runLeaderLoss(t, which)
		})
	}
}

func runLeaderLoss(t *testing.T, which string) {
	seed := faultSeed(t)
	bin := ""
	kill := strings.HasSuffix(which, "-kill")
	if kill {
		bin = testenv.NATSServerBinary(t)
	}
	e, c := newClusterEnv(t, bin)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r := startFaultRelay(e, "relay", "RELAY_METRICS_ADDR="+addr, "RELAY_STATS_INTERVAL=200ms", "RELAY_PUBLISH_TIMEOUT=2s")
	lag := sampleLag(t, addr)
	load := startFaultLoad(e, 2, 0, 10, 15*time.Millisecond, seed)
	testenv.Eventually(t, 30*time.Second, func() bool { _, a, n := e.counts(); return a > 300 && n > 300 }, "no progress before the fault")

	streamLeader, metaLeader := separateLeaders(t, e, c)
	victim := streamLeader
	if strings.HasPrefix(which, "meta-leader") {
		victim = metaLeader
	}
	lostBefore := strings.Count(r.out.String(), "nats disconnected")
	lastBefore := e.maxCommittedID()
	t0 := time.Now()
	if kill {
		c.Kill(victim)
	} else {
		c.Stop(victim)
	}
	t.Logf("took %s down (%s; stream leader %s, meta leader %s) with %d rows committed",
		c.NodeName(victim), which, c.NodeName(streamLeader), c.NodeName(metaLeader), load.written.Load())

	// The cluster goes on without it: a new leader, and PubAcks for rows
	// written after the shutdown.
	switch {
	case strings.HasPrefix(which, "stream-leader"):
		testenv.Eventually(t, 30*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			l, err := c.StreamLeader(ctx, e.js, e.stream)
			return err == nil && l >= 0 && l != victim
		}, "no new stream leader")
	default:
		c.WaitMetaLeader(30 * time.Second)
	}
	elected := time.Since(t0)
	var firstAck *time.Time
	testenv.Eventually(t, 30*time.Second, func() bool { firstAck = e.firstNATSDeliveryAfter(lastBefore); return firstAck != nil },
		"no row written after the shutdown reached the stream")
	recovery := firstAck.Sub(t0)
	w := load.written.Load()
	testenv.Eventually(t, 30*time.Second, func() bool { return load.written.Load() >= w+300 }, "producers stuck")

	c.Start(victim)
	c.WaitMetaLeader(30 * time.Second)
	c.WaitStreamCurrent(e.js, e.stream, 30*time.Second)
	back := time.Since(t0)
	w = load.written.Load()
	testenv.Eventually(t, 30*time.Second, func() bool { return load.written.Load() >= w+300 }, "producers stuck")
	committed := load.wait()
	e.waitDelivered(60 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool {
		l := lag.since(time.Now().Add(-150 * time.Millisecond))
		return len(l) > 0 && l[len(l)-1].nats == 0 && l[len(l)-1].amqp == 0
	}, "lag gauges not back to 0")
	samples := lag.since(t0)
	lag.stopFn()

	if !r.running() {
		t.Fatalf("relayd exited:\n%s", r.out.String())
	}
	if got := e.committedIDs(); len(got) != len(committed) {
		t.Fatalf("table has %d rows, producers committed %d", len(got), len(committed))
	}
	sMissing, sExtra, sDupes := tally(committed, e.clusterStreamIDs())
	qMissing, qExtra, qDupes := tally(committed, e.queueIDs(time.Second))
	peak, under1, amqpPeak := lagFigures(samples, t0)
	t.Logf("%s: %d rows committed; jetstream: %d lost, %d not committed, %d duplicates; rabbitmq: %d lost, %d not committed, %d duplicates",
		which, len(committed), sMissing, sExtra, sDupes, qMissing, qExtra, qDupes)
	t.Logf("%s: new leader within %v; first PubAck of a row written after it went %v after; node back and current after %v; "+
		"nats lag peak %.2fs, back under 1s %v after it went (0: never above); amqp lag peak %.2fs; relayd lost its nats connection %d times; %d lag samples",
		which, elected.Round(time.Millisecond), recovery.Round(time.Millisecond), back.Round(time.Millisecond),
		peak, under1.Round(time.Millisecond), amqpPeak, strings.Count(r.out.String(), "nats disconnected")-lostBefore, len(samples))
	if sMissing > 0 || sExtra > 0 || sDupes > 0 {
		t.Errorf("jetstream: %d committed rows: %d missing, %d not committed, %d duplicates; want each exactly once", len(committed), sMissing, sExtra, sDupes)
	}
	if qMissing > 0 || qExtra > 0 || qDupes > 0 {
		t.Errorf("rabbitmq: %d committed rows: %d missing, %d not committed, %d duplicates; want each once (a NATS fault re-sends nothing to RabbitMQ)",
			len(committed), qMissing, qExtra, qDupes)
	}
	if under1 < 0 {
		t.Errorf("nats lag peaked at %.2fs and never came back under 1s", peak)
	}
	// A killed stream leader hands nothing over: the others elect a new one
	// after their election timeout (4 s at least), and the gauge shows it.
	if which == "stream-leader-kill" && (peak < 2 || under1 <= 0) {
		t.Errorf("nats lag peaked at %.2fs (back under 1s %v after the kill): want the stall (>= 2s) and the recovery on the gauge", peak, under1)
	}
}

// A backfill of a legacy queue into the R3 stream while the stream's leader
// is shut down (case shutdown) or SIGKILLed (case kill) mid-way, and started
// again: every legacy message is in the stream exactly once and the queue is
// empty. Then `relayd cutover check` against a durable consumer with three
// replicas: FAIL while it has not read the stream, READY once it has read
// and acked everything, with that consumer's leader gone the same way (its
// state read from the new leader).
func TestClusterBackfillAndCutover(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"shutdown", "kill"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			runBackfillAndCutover(t, how == "kill")
		})
	}
}

func runBackfillAndCutover(t *testing.T, kill bool) {
	bin := ""
	if kill {
		bin = testenv.NATSServerBinary(t)
	}
	e, c := newClusterEnv(t, bin)
	lose := c.Stop
	if kill {
		lose = c.Kill
	}
	ctx := context.Background()
	const total = 6_000
	legacy := make([]amqp.Publishing, total)
	want := map[string]bool{}
	for i := range legacy {
		id := fmt.Sprintf("legacy-%06d", i)
		legacy[i] = amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(fmt.Sprintf(`{"legacy":%d}`, i))}
		want[id] = true
	}
	e.legacyPublish(legacy, "orders.legacy")

	_, out, done := e.startBackfill(t, "", "--prefetch", "200")
	testenv.Eventually(t, 60*time.Second, func() bool { return e.streamCount() >= total/5 }, "backfill made no progress:\n%s", out)
	leader := c.WaitStreamCurrent(e.js, e.stream, 20*time.Second)
	at := e.streamCount()
	t0 := time.Now()
	lose(leader)
	sum := finished(t, done, out, 2*time.Minute, "backfill")
	took := time.Since(t0)
	c.Start(leader)
	c.WaitMetaLeader(30 * time.Second)
	c.WaitStreamCurrent(e.js, e.stream, 30*time.Second)
	t.Logf("backfill: stream leader %s gone with %d of %d in the stream; the run ended %v later: %+v",
		c.NodeName(leader), at, total, took.Round(time.Millisecond), sum)
	if took > 12*time.Second { // an election takes 9 s at most: say what the run waited for
		var lines []string
		for _, l := range strings.Split(out.String(), "\n") {
			if !strings.Contains(l, "level=DEBUG") {
				lines = append(lines, l)
			}
		}
		t.Logf("backfill output, debug lines left out:\n%s", strings.Join(lines, "\n"))
	}

	if n, cons := e.queueDepth(e.queue); n != 0 || cons != 0 {
		t.Fatalf("legacy queue: %d messages, %d consumers after the backfill; want empty", n, cons)
	}
	missing, extra, dupes := tally(want, e.clusterStreamIDs())
	t.Logf("backfill: %d legacy messages; jetstream: %d lost, %d unknown, %d duplicates", total, missing, extra, dupes)
	if missing > 0 || extra > 0 || dupes > 0 {
		t.Fatalf("stream after the backfill: %d missing, %d unknown, %d duplicates of %d; want each exactly once", missing, extra, dupes, total)
	}

	// A replicated durable consumer that has not read anything: not ready.
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	const durable = "billing"
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, Replicas: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	check := func(args ...string) (string, int) {
		cmd := exec.Command(relaydBin, append([]string{"cutover", "check", "--consumer", durable, "--queue", e.queue, "--quiet-period", "2s"}, args...)...)
		cmd.Env = e.relayEnv()
		dieWithTest(cmd)
		b, err := cmd.CombinedOutput()
		if _, ok := err.(*exec.ExitError); err != nil && !ok {
			t.Fatalf("cutover check: %v", err)
		}
		return string(b), cmd.ProcessState.ExitCode()
	}
	if got, code := check(); code != 1 || !strings.Contains(got, "FAIL") {
		t.Fatalf("cutover check with the consumer %d behind: exit %d, want 1 and a FAIL:\n%s", total, code, got)
	} else {
		t.Logf("cutover check, consumer not caught up (exit %d):\n%s", code, got)
	}

	// It reads and acks everything; then its leader goes.
	cc, err := cons.Consume(func(m jetstream.Msg) { m.Ack() }) //nolint:errcheck // counted by the consumer info below
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream >= total
	}, "consumer did not read and ack the stream")
	cc.Stop()
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Cluster == nil || len(ci.Cluster.Replicas) != 2 {
		t.Fatalf("consumer cluster info %+v: want a leader and two replicas", ci.Cluster)
	}
	cl := c.Index(ci.Cluster.Leader)
	lose(cl)
	got, code := check("--wait", "--timeout", "60s")
	if code != 0 || !strings.Contains(got, "READY") {
		t.Fatalf("cutover check with the consumer caught up and its leader %s gone: exit %d, want 0 and READY:\n%s", c.NodeName(cl), code, got)
	}
	t.Logf("cutover check, consumer caught up, its leader %s gone (exit %d):\n%s", c.NodeName(cl), code, got)
	c.Start(cl)
}
