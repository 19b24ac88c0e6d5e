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
// most, each one INSERT of rate/LatencyCommits rows, as the earlier runs
// that docs/performance.md compares against did. A JetStream
// consumer and an AMQP consumer record when each message id arrives; a
// row's latency is the later arrival minus its commit.
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

	// Consumers first, each on a connection of its own.
	nc, err := nats.Connect(b.o.NATSURL, nats.Name("relayd-bench-consumer"))
	if err != nil {
		return l, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return l, err
	}
	oc, err := js.OrderedConsumer(ctx, cr.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return l, err
	}
	cc, err := oc.Consume(func(m jetstream.Msg) { rec.received(m.Headers().Get(jetstream.MsgIDHeader), true) })
	if err != nil {
		return l, err
	}
	defer cc.Stop()

	// The AMQP probe only notes arrivals: automatic acks, 64 KiB reads
	// (amqpio, as the backfill reads), so that the probe's own work does not
	// take the cores the relay shares.
	aconn, err := amqpio.DialURL(b.o.AMQPURL, amqpio.DialOptions{Timeout: 30 * time.Second})
	if err != nil {
		return l, err
	}
	consumerDone := make(chan struct{})
	defer func() { aconn.Close(); <-consumerDone }()
	ach, err := aconn.Channel()
	if err != nil {
		return l, err
	}
	deliveries, err := ach.Consume(cr.queue, "relayd-bench-latency", true, false, false, false, nil)
	if err != nil {
		close(consumerDone)
		return l, err
	}
	go func() {
		defer close(consumerDone)
		for d := range deliveries {
			rec.received(d.MessageId, false)
		}
	}()

	p, err := b.start(cr.relaydEnv("amqp,nats"), "run")
	if err != nil {
		return l, err
	}
	defer p.kill()
	if err := p.waitStarted(ctx); err != nil {
		return l, err
	}

	// The timetable: commit i starts at start + i/commitRate and writes
	// rowsPerCommit rows in one INSERT (one commit). Times are
	// durations since rec.t0.
	rows := l.RowsPerCommit
	total := int(float64(rate) * (b.o.LatencyWarmup + b.o.LatencyDuration).Seconds() / float64(rows))
	firstMeasured := int(float64(rate) * b.o.LatencyWarmup.Seconds() / float64(rows))
	slotAt := func(i int) time.Duration {
		return time.Duration(float64(i) * float64(rows) / float64(rate) * float64(time.Second))
	}
	producers := latencyProducers
	l.Producers = producers
	insert := `INSERT INTO ` + cr.table.Ident() + ` (message_id, topic, payload) SELECT unnest($1::text[])::uuid, $2, $3`
	// Every producer has a connection open before the clock starts.
	conns := make([]func(), 0, producers)
	for range producers {
		c, err := b.pool.Acquire(ctx)
		if err != nil {
			return l, err
		}
		conns = append(conns, c.Release)
	}
	for _, release := range conns {
		release()
	}

	var next atomic.Int64
	var prodErr atomic.Pointer[error]
	var wg sync.WaitGroup
	snap := takeCPUSnap()
	start := time.Since(rec.t0) + 20*time.Millisecond
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]string, rows)
			for ctx.Err() == nil && prodErr.Load() == nil {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				at := start + slotAt(i)
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
	l.CPU = cpuSplit(snap, takeCPUSnap(), total*rows, p)
	if e := prodErr.Load(); e != nil {
		return l, fmt.Errorf("producer: %w", *e)
	}
	if err := ctx.Err(); err != nil {
		return l, err
	}

	// Wait for the stragglers: every measured message from both brokers.
	grace := 20 * time.Second
	if b.o.Smoke {
		grace = 10 * time.Second
	}
	graceStart := time.Now()
	waitUntil := graceStart.Add(grace)
	firstMissing := -1
	for {
		p.sampleHWM()
		rec.mu.Lock()
		missing := 0
		for _, r := range rec.m {
			if r.slot >= firstMeasured && (r.natsAt == 0 || r.amqpAt == 0) {
				missing++
			}
		}
		rec.mu.Unlock()
		if firstMissing < 0 {
			firstMissing = missing
		}
		if missing == 0 || time.Now().After(waitUntil) {
			break
		}
		// A backlog that will not drain within the grace (the relay fell
		// behind the rate): the figures say so already, stop waiting.
		if waited := time.Since(graceStart); waited >= 3*time.Second {
			perSec := float64(firstMissing-missing) / waited.Seconds()
			if perSec <= 0 || float64(missing)/perSec > time.Until(waitUntil).Seconds() {
				break
			}
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return l, ctx.Err()
		}
	}
	// A message not at both brokers yet has waited at least this long.
	waitEnd := int64(time.Since(rec.t0))
	u, err := p.stop()
	if err != nil {
		return l, err
	}
	l.CPUSecondsPer10k = per10k(u.CPU, total*rows)
	l.PeakRSSMiB = mib(u.PeakRSS)

	rec.mu.Lock()
	lastCommit := l.figures(rec.m, firstMeasured, waitEnd)
	rec.mu.Unlock()
	if want := (total - firstMeasured) * rows; l.Committed != want {
		return l, fmt.Errorf("%d measured rows committed, want %d", l.Committed, want)
	}
	if l.Received == 0 {
		return l, fmt.Errorf("no message of %d arrived at both brokers", l.Committed)
	}
	// Rows per second from the first measured slot to the last measured
	// commit: on schedule, the rate asked for.
	windowStart := start + slotAt(firstMeasured)
	if span := time.Duration(lastCommit) - windowStart; span > 0 {
		l.AchievedRate = round(float64(l.Committed)/span.Seconds(), 0)
	}
	// Behind: more than 1% of the commits started over lateThreshold late.
	l.FellBehind = l.LateStarts*100 > total-firstMeasured
	return l, nil
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
