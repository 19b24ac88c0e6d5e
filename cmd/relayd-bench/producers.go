package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/outboxsql"
)

// producerClients are the connection counts of the producers' commit runs.
var producerClients = []int{16, 32, 64}

// smokeClientsDivisor shrinks them in a smoke run, which shares Postgres's
// max_connections (100 by default) with the rest of the test suite.
const smokeClientsDivisor = 8

// clients is the connection count of producers' run c.
func (b *bench) clients(c int) int {
	if b.o.Smoke {
		return max(1, c/smokeClientsDivisor)
	}
	return c
}

// producerRounds is how many times each table is measured per connection
// count, the tables taking turns. The figures are the rounds' medians, the
// ratio the median of each round's: one slow moment of the machine moves a
// best-of-two ratio by 0.1.
const producerRounds = 5

// producers measures what relayd costs the services that write the outbox:
// single-row commits/s into a bare table with the producers' columns and
// into the outbox, with no relay draining it (never started, then after one
// that waited for rows was SIGKILLed); their commit latency at a steady
// rate while relayd relays; and an idle relay's latency, commit to both
// brokers.
func (b *bench) producers(ctx context.Context, res *Results) error {
	return b.withCorner(ctx, cornerSpec{table: true, stream: true, amqp: true}, func(cr *corner) error {
		bare := `"` + cr.table.Schema + `".bare`
		if _, err := b.pool.Exec(ctx, `CREATE TABLE `+bare+` (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			message_id uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE,
			topic text NOT NULL, key text, headers jsonb, payload bytea NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		p := &Producers{}
		res.Producers = p
		outbox := cr.table.Ident()
		for _, c := range producerClients {
			c = b.clients(c)
			bareRate, outboxRate, ratio, err := b.commitRounds(ctx, bare, outbox, c)
			if err != nil {
				return err
			}
			p.Runs = append(p.Runs, ProducerRun{Clients: c, Bare: bareRate, Outbox: outboxRate, Ratio: ratio})
		}

		b.logf("producers: a relayd waits for rows, then is SIGKILLed")
		if err := b.killWaitingRelay(ctx, cr); err != nil {
			return err
		}
		for i := range producerClients {
			run := &p.Runs[i]
			var err error
			if run.BareAfterKill, run.AfterKill, run.AfterKillRatio, err = b.commitRounds(ctx, bare, outbox, run.Clients); err != nil {
				return err
			}
		}

		// The rounds leave Postgres checkpointing and vacuuming: the idle
		// relay is measured on a settled machine, as every ceiling is.
		b.settle(ctx)
		relay, err := b.start(cr.relaydEnv("amqp,nats"), "run")
		if err != nil {
			return err
		}
		defer relay.kill()
		if err := relay.waitStarted(ctx); err != nil {
			return err
		}
		if p.Idle, err = b.idleLatency(ctx, cr); err != nil {
			return err
		}
		for _, t := range []struct {
			table string
			dst   *CommitLatency
		}{{bare, &p.BareLatency}, {outbox, &p.OutboxLatency}} {
			if *t.dst, err = b.commitLatency(ctx, t.table); err != nil {
				return err
			}
		}
		_, err = relay.stop()
		return err
	})
}

// commitRounds measures bare and outbox producerRounds times each from
// clients connections, taking turns (the first of each round alternating),
// and returns the median rates and the median of the rounds' ratios.
func (b *bench) commitRounds(ctx context.Context, bare, outbox string, clients int) (bareRate, outboxRate, ratio float64, err error) {
	var bares, outboxes, ratios []float64
	for i := range producerRounds {
		order := []string{bare, outbox}
		if i%2 == 1 {
			order = []string{outbox, bare}
		}
		rates := map[string]float64{}
		for _, t := range order {
			if rates[t], err = b.commitRate(ctx, t, clients); err != nil {
				return 0, 0, 0, err
			}
		}
		bares, outboxes = append(bares, rates[bare]), append(outboxes, rates[outbox])
		ratios = append(ratios, rates[outbox]/rates[bare])
	}
	return round(median(bares), 0), round(median(outboxes), 0), round(median(ratios), 2), nil
}

// median is the middle of v (of an odd count; the upper middle otherwise).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// commitRate truncates table, then has clients producers commit one-row
// INSERTs of the benchmark payload into it as fast as they can.
func (b *bench) commitRate(ctx context.Context, table string, clients int) (float64, error) {
	if _, err := b.pool.Exec(ctx, `TRUNCATE `+table); err != nil {
		return 0, err
	}
	b.checkpoint(ctx)
	d := 3 * time.Second
	if b.o.Smoke {
		d = 300 * time.Millisecond
	}
	n, elapsed, err := b.commitFor(ctx, table, clients, d)
	if err != nil {
		return 0, err
	}
	rate := float64(n) / elapsed.Seconds()
	b.logf("producers: %d connections into %s: %s commits/s", clients, table, thousands(rate))
	return round(rate, 0), nil
}

// commitFor has clients producers commit one-row INSERTs of the benchmark
// payload into table for d, and returns how many committed and in what time.
func (b *bench) commitFor(ctx context.Context, table string, clients int, d time.Duration) (int, time.Duration, error) {
	insert := `INSERT INTO ` + table + ` (topic, payload) VALUES ($1, $2)`
	var count atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if _, err := b.pool.Exec(ctx, insert, topic, b.payload); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				count.Add(1)
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return 0, 0, *e
	}
	return int(count.Load()), time.Since(start), nil
}

// killWaitingRelay starts relayd on cr, waits until it holds the table's
// wake lock (it waits for rows), SIGKILLs it, and waits until Postgres has
// dropped the lock with its session.
func (b *bench) killWaitingRelay(ctx context.Context, cr *corner) error {
	p, err := b.start(cr.relaydEnv("amqp,nats"), "run")
	if err != nil {
		return err
	}
	defer p.kill()
	if err := p.waitStarted(ctx); err != nil {
		return err
	}
	// until waits for the lock to be held (or not).
	until := func(held bool) error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var pid int
			err := b.pool.QueryRow(ctx, outboxsql.WakeLockHolder(cr.table.WakeLock())).Scan(&pid)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if (pid != 0) == held {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("relayd's wake lock held %v after 30 s, want %v", pid != 0, held)
			}
			if !backoff.Sleep(ctx, 10*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	if err := until(true); err != nil {
		return err
	}
	p.kill()
	return until(false)
}

// commitLatency commits single rows into table at producerLatencyRate on a
// fixed timetable from 16 connections and returns the commits' latency.
func (b *bench) commitLatency(ctx context.Context, table string) (CommitLatency, error) {
	const producers = 16
	l := CommitLatency{CommitsPerSecond: producerLatencyRate}
	d := 10 * time.Second
	if b.o.Smoke {
		d = time.Second
	}
	n := int(d.Seconds() * producerLatencyRate)
	insert := `INSERT INTO ` + table + ` (topic, payload) VALUES ($1, $2)`
	took := make([]time.Duration, n)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now().Add(100 * time.Millisecond)
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				at := start.Add(time.Duration(i) * time.Second / producerLatencyRate)
				time.Sleep(time.Until(at))
				t0 := time.Now()
				if _, err := b.pool.Exec(ctx, insert, topic, b.payload); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				took[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return l, *e
	}
	slices.Sort(took)
	l.P50Ms, l.P99Ms = msOf(pct(took, 50)), msOf(pct(took, 99))
	b.logf("producers: commit latency into %s at %d/s: p50 %.2f ms, p99 %.2f ms", table, producerLatencyRate, l.P50Ms, l.P99Ms)
	return l, nil
}

// producerLatencyRate is the steady rate of the producers' latency runs.
const producerLatencyRate = 1000

// idleLatency commits single rows to an idle relay, one at a time, and
// returns the median and largest time from commit to both brokers.
func (b *bench) idleLatency(ctx context.Context, cr *corner) (*IdleLatency, error) {
	n := 50
	if b.o.Smoke {
		n = 10
	}
	arrived := make(chan string, 2*n)
	oc, err := b.js.OrderedConsumer(ctx, cr.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, err
	}
	cc, err := oc.Consume(func(m jetstream.Msg) { arrived <- m.Headers().Get(jetstream.MsgIDHeader) })
	if err != nil {
		return nil, err
	}
	defer cc.Stop()
	ch, err := b.amqpConn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	deliveries, err := ch.Consume(cr.queue, "", true, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	go func() {
		for d := range deliveries {
			arrived <- d.MessageId
		}
	}()
	lat := make([]time.Duration, 0, n)
	for i := range n + 1 { // the first, the relay's first wake-up since it started, not measured
		// Idle: the relay's batch is recorded and it waits again.
		if !backoff.Sleep(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
		id := uuid.NewString()
		start := time.Now()
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+cr.table.Ident()+` (message_id, topic, payload) VALUES ($1, $2, $3)`, id, topic, b.payload); err != nil {
			return nil, err
		}
		for seen := 0; seen < 2; {
			select {
			case got := <-arrived:
				if got == id {
					seen++
				}
			case <-time.After(10 * time.Second):
				return nil, fmt.Errorf("idle latency: row %s not on both brokers after 10 s", id)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if i > 0 {
			lat = append(lat, time.Since(start))
		}
	}
	slices.Sort(lat)
	l := &IdleLatency{Rows: n, P50Ms: msOf(pct(lat, 50)), MaxMs: msOf(lat[len(lat)-1])}
	b.logf("producers: idle relay, commit to both brokers: median %.2f ms, max %.2f ms", l.P50Ms, l.MaxMs)
	return l, nil
}
