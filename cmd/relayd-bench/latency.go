package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/backoff"
)

func (b *bench) latencies(ctx context.Context, res *Results) error {
	for _, rate := range b.o.LatencyRates {
		b.logf("latency: %s rows/s, dual write, %v warm-up + %v measured", thousands(float64(rate)), b.o.LatencyWarmup, b.o.LatencyDuration)
		l, err := b.latency(ctx, rate)
		if err != nil {
			return fmt.Errorf("%d/s: %w", rate, err)
		}
		bound := ""
		if l.LowerBounds {
			bound = "at least "
		}
		b.logf("  %sp50 %.1f ms, p90 %.1f ms, p99 %.1f ms (NATS alone %.1f, RabbitMQ alone %.1f), max %.1f ms; %d received, %d not yet arrived when the wait ended; %d commits started > %v late",
			bound, l.P50Ms, l.P90Ms, l.P99Ms, l.NATSP99Ms, l.AMQPP99Ms, l.MaxMs, l.Received, l.Missing, l.LateStarts, lateThreshold)
		res.Latency = append(res.Latency, l)
		b.settle(ctx)
	}
	return nil
}

// latencyRec is one message's timeline, in nanoseconds since the run's start.
type latencyRec struct {
	slot           int
	commit         int64 // the producer's COMMIT returned
	late           int64 // how late the commit started against its slot
	natsAt, amqpAt int64 // received by each consumer; 0: not yet
}

// recorder pairs commits with receipts, whichever comes first.
type recorder struct {
	t0 time.Time
	mu sync.Mutex
	m  map[string]*latencyRec
}

func (r *recorder) get(id string) *latencyRec {
	rec := r.m[id]
	if rec == nil {
		rec = &latencyRec{slot: -1}
		r.m[id] = rec
	}
	return rec
}

func (r *recorder) committed(id string, slot int, commit, late int64) {
	r.mu.Lock()
	rec := r.get(id)
	rec.slot, rec.commit, rec.late = slot, commit, late
	r.mu.Unlock()
}

func (r *recorder) received(id string, nats bool) {
	now := int64(time.Since(r.t0))
	r.mu.Lock()
	rec := r.get(id)
	if nats {
		if rec.natsAt == 0 {
			rec.natsAt = now
		}
	} else if rec.amqpAt == 0 {
		rec.amqpAt = now
	}
	r.mu.Unlock()
}

// latencyProducers is how many producer goroutines (each with its own
// connection while it commits) serve the timetable.
const latencyProducers = 16

// latency runs one relayd (dual write, default settings) while producers
// commit rate rows per second on a fixed timetable, regardless of how long
// earlier commits took (open loop): LatencyCommits commits per second at
// most, each one INSERT of rate/LatencyCommits rows. A JetStream consumer
// and an AMQP consumer record when each message id arrives; a row's latency
// is the later arrival minus its commit.
func (b *bench) latency(ctx context.Context, rate int) (l Latency, err error) {
	l = Latency{Rate: rate, Targets: "amqp,nats", WarmupSeconds: b.o.LatencyWarmup.Seconds(), MeasuredSeconds: b.o.LatencyDuration.Seconds()}
	l.RowsPerCommit = max(1, (rate+b.o.LatencyCommits-1)/b.o.LatencyCommits)
	l.CommitsPerSecond = round(float64(rate)/float64(l.RowsPerCommit), 1)
	cr, err := b.newCorner(ctx, cornerSpec{table: true, stream: true, amqp: true})
	if err != nil {
		return l, err
	}
	defer cr.close()
	b.checkpoint(ctx)

	rec := &recorder{t0: time.Now(), m: make(map[string]*latencyRec, rate*int((b.o.LatencyWarmup+b.o.LatencyDuration)/time.Second+1))}
	stopConsumers, err := b.latencyConsumers(ctx, cr, rec)
	if err != nil {
		return l, err
	}
	defer stopConsumers()

	p, err := b.start(cr.relaydEnv("amqp,nats"), "run")
	if err != nil {
		return l, err
	}
	defer p.kill()
	if err := p.waitStarted(ctx); err != nil {
		return l, err
	}

	tt := timetable{rate: rate, rows: l.RowsPerCommit}
	tt.total = int(float64(rate) * (b.o.LatencyWarmup + b.o.LatencyDuration).Seconds() / float64(tt.rows))
	tt.firstMeasured = int(float64(rate) * b.o.LatencyWarmup.Seconds() / float64(tt.rows))
	l.Producers = latencyProducers
	if err := b.openProducerConns(ctx, latencyProducers); err != nil {
		return l, err
	}
	snap := takeCPUSnap()
	start, err := b.produce(ctx, cr, rec, tt, latencyProducers)
	l.CPU = cpuSplit(snap, takeCPUSnap(), tt.total*tt.rows, p)
	if err != nil {
		return l, err
	}
	if err := ctx.Err(); err != nil {
		return l, err
	}
	if err := b.awaitStragglers(ctx, p, rec, tt.firstMeasured); err != nil {
		return l, err
	}
	// A message not at both brokers yet has waited at least this long.
	waitEnd := int64(time.Since(rec.t0))
	u, err := p.stop()
	if err != nil {
		return l, err
	}
	l.CPUSecondsPer10k = per10k(u.CPU, tt.total*tt.rows)
	l.PeakRSSMiB = mib(u.PeakRSS)
	err = l.summarise(rec, tt, start, waitEnd)
	return l, err
}

// timetable is the latency run's schedule: commit i starts at
// start + slotAt(i) and writes rows rows in one INSERT (one commit).
type timetable struct {
	rate, rows           int
	total, firstMeasured int // commits in all; the first one measured
}

// slotAt is when commit i starts, after the run's start.
func (tt timetable) slotAt(i int) time.Duration {
	return time.Duration(float64(i) * float64(tt.rows) / float64(tt.rate) * float64(time.Second))
}

// latencyConsumers starts a JetStream and an AMQP consumer, each on a
// connection of its own, that note each message's arrival in rec. stop
// stops them.
func (b *bench) latencyConsumers(ctx context.Context, cr *corner, rec *recorder) (stop func(), err error) {
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	nc, err := nats.Connect(b.o.NATSURL, nats.Name("relayd-bench-consumer"))
	if err != nil {
		return nil, err
	}
	closers = append(closers, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	oc, err := js.OrderedConsumer(ctx, cr.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, err
	}
	cc, err := oc.Consume(func(m jetstream.Msg) { rec.received(m.Headers().Get(jetstream.MsgIDHeader), true) })
	if err != nil {
		return nil, err
	}
	closers = append(closers, cc.Stop)

	// The AMQP probe only notes arrivals: automatic acks, 64 KiB reads
	// (amqpio, as the backfill reads), so that the probe's own work does not
	// take the cores the relay shares.
	aconn, err := amqpio.DialURL(b.o.AMQPURL, amqpio.DialOptions{Timeout: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { aconn.Close() })
	ach, err := aconn.Channel()
	if err != nil {
		return nil, err
	}
	deliveries, err := ach.Consume(cr.queue, "relayd-bench-latency", true, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		for d := range deliveries {
			rec.received(d.MessageId, false)
		}
	}()
	closers[len(closers)-1] = func() { aconn.Close(); <-consumerDone }
	return stop, nil
}

// openProducerConns has n pool connections open before the clock starts.
func (b *bench) openProducerConns(ctx context.Context, n int) error {
	conns := make([]func(), 0, n)
	defer func() {
		for _, release := range conns {
			release()
		}
	}()
	for range n {
		c, err := b.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c.Release)
	}
	return nil
}

// produce commits tt's rows from n producer goroutines, each commit at its
// slot, and notes each commit in rec. start is the timetable's start, since
// rec.t0.
func (b *bench) produce(ctx context.Context, cr *corner, rec *recorder, tt timetable, n int) (start time.Duration, err error) {
	insert := `INSERT INTO ` + cr.table.Ident() + ` (message_id, topic, payload) SELECT unnest($1::text[])::uuid, $2, $3`
	var next atomic.Int64
	var prodErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start = time.Since(rec.t0) + 20*time.Millisecond
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]string, tt.rows)
			for ctx.Err() == nil && prodErr.Load() == nil {
				i := int(next.Add(1) - 1)
				if i >= tt.total {
					return
				}
				at := start + tt.slotAt(i)
				if d := at - time.Since(rec.t0); d > 0 {
					time.Sleep(d)
				}
				late := time.Since(rec.t0) - at
				for j := range ids {
					ids[j] = uuid.NewString()
				}
				if _, err := b.pool.Exec(ctx, insert, ids, topic, b.payload); err != nil {
					prodErr.CompareAndSwap(nil, &err)
					return
				}
				commit := int64(time.Since(rec.t0))
				for _, id := range ids {
					rec.committed(id, i, commit, int64(late))
				}
			}
		}()
	}
	wg.Wait()
	if e := prodErr.Load(); e != nil {
		return start, fmt.Errorf("producer: %w", *e)
	}
	return start, nil
}

// awaitStragglers waits for every measured message to reach both brokers,
// for a grace at most, and less once the backlog clearly will not drain
// within it (the relay fell behind the rate: the figures say so already).
func (b *bench) awaitStragglers(ctx context.Context, p *proc, rec *recorder, firstMeasured int) error {
	grace := 20 * time.Second
	if b.o.Smoke {
		grace = 10 * time.Second
	}
	graceStart := time.Now()
	waitUntil := graceStart.Add(grace)
	firstMissing := -1
	for {
		p.sampleHWM()
		missing := rec.missing(firstMeasured)
		if firstMissing < 0 {
			firstMissing = missing
		}
		if missing == 0 || time.Now().After(waitUntil) {
			return nil
		}
		if waited := time.Since(graceStart); waited >= 3*time.Second {
			perSec := float64(firstMissing-missing) / waited.Seconds()
			if perSec <= 0 || float64(missing)/perSec > time.Until(waitUntil).Seconds() {
				return nil
			}
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// missing counts the measured messages not yet at both brokers.
func (r *recorder) missing(firstMeasured int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.m {
		if rec.slot >= firstMeasured && (rec.natsAt == 0 || rec.amqpAt == 0) {
			n++
		}
	}
	return n
}

// summarise fills in l's figures from rec and checks that the run measured
// what it should have.
func (l *Latency) summarise(rec *recorder, tt timetable, start time.Duration, waitEnd int64) error {
	rec.mu.Lock()
	lastCommit := l.figures(rec.m, tt.firstMeasured, waitEnd)
	rec.mu.Unlock()
	if want := (tt.total - tt.firstMeasured) * tt.rows; l.Committed != want {
		return fmt.Errorf("%d measured rows committed, want %d", l.Committed, want)
	}
	if l.Received == 0 {
		return fmt.Errorf("no message of %d arrived at both brokers", l.Committed)
	}
	// Rows per second from the first measured slot to the last measured
	// commit: on schedule, the rate asked for.
	windowStart := start + tt.slotAt(tt.firstMeasured)
	if span := time.Duration(lastCommit) - windowStart; span > 0 {
		l.AchievedRate = round(float64(l.Committed)/span.Seconds(), 0)
	}
	// Behind: more than 1% of the commits started over lateThreshold late.
	l.FellBehind = l.LateStarts*100 > tt.total-tt.firstMeasured
	return nil
}

// figures fills in l's counts and percentiles from the messages of the
// measured slots (firstMeasured on), and returns the last one's commit time.
// A message not at both brokers when the wait ended, at waitEnd, counts with
// the time it had waited by then: with any such (Missing), every figure is
// a lower bound (LowerBounds).
func (l *Latency) figures(recs map[string]*latencyRec, firstMeasured int, waitEnd int64) (lastCommit int64) {
	var lat, natsLat, amqpLat, late []time.Duration
	lateSlots := map[int]bool{}
	for _, r := range recs {
		if r.slot < firstMeasured {
			continue
		}
		l.Committed++
		late = append(late, time.Duration(r.late))
		lastCommit = max(lastCommit, r.commit)
		if r.late > int64(lateThreshold) {
			lateSlots[r.slot] = true
		}
		natsAt, amqpAt := r.natsAt, r.amqpAt
		if natsAt == 0 || amqpAt == 0 {
			l.Missing++
			natsAt, amqpAt = cmp.Or(natsAt, waitEnd), cmp.Or(amqpAt, waitEnd)
		}
		lat = append(lat, max(0, time.Duration(max(natsAt, amqpAt)-r.commit)))
		natsLat = append(natsLat, max(0, time.Duration(natsAt-r.commit)))
		amqpLat = append(amqpLat, max(0, time.Duration(amqpAt-r.commit)))
	}
	l.Received = l.Committed - l.Missing
	l.LowerBounds = l.Missing > 0
	l.LateStarts = len(lateSlots)
	if l.Committed == 0 {
		return 0
	}
	slices.Sort(lat)
	slices.Sort(late)
	slices.Sort(natsLat)
	slices.Sort(amqpLat)
	l.NATSP99Ms, l.AMQPP99Ms = msOf(pct(natsLat, 99)), msOf(pct(amqpLat, 99))
	l.P50Ms, l.P90Ms, l.P99Ms, l.MaxMs = msOf(pct(lat, 50)), msOf(pct(lat, 90)), msOf(pct(lat, 99)), msOf(lat[len(lat)-1])
	l.P99LateMs, l.MaxLateMs = msOf(pct(late, 99)), msOf(late[len(late)-1])
	return lastCommit
}

// pct is the p-th percentile of sorted (nearest rank).
func pct(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func msOf(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }
