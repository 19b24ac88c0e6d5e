package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/backfill"
	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/jspub"
)

// In-flight windows of the ceilings: what relayd keeps in flight at its
// defaults (8 workers × 500 rows, under natssink's MaxPending 4096; the
// backfill's prefetch).
const (
	jsInFlight        = 4096
	jsWorkers         = 8
	jsBatch           = 500
	amqpInFlight      = 2000
	consumePrefetch   = backfill.DefaultPrefetch
	consumeAckEvery   = 256 // the backfill's batch
	pgClaimBatch      = 500
	pgClaimWorkers    = 4
	consumeIdleBudget = 30 * time.Second

	// Between measurements the machine settles: at most settleMax, until
	// less than settleBusy of its CPU is busy.
	settleMax  = 10 * time.Second
	settleBusy = 0.25
)

// ceilings measures each service alone, one after the other. The ceilings
// the burn-downs and the backfill are set against are sampled twice, and
// the better sample counts: a ceiling is what the service can do, and single
// samples on one machine vary widely (docs/performance.md, "The command").
func (b *bench) ceilings(ctx context.Context, res *Results) error {
	defer oneP()()
	n := b.o.CeilingMsgs
	if err := b.jetstreamSample(ctx, res, n, ""); err != nil {
		return err
	}
	if err := b.amqpPlainSample(ctx, res, max(1, n/2)); err != nil {
		return err
	}
	if err := b.amqpSample(ctx, res, n, "", true); err != nil {
		return err
	}
	if err := b.postgresSample(ctx, res, n, ""); err != nil {
		return err
	}
	if err := b.commitSample(ctx, res); err != nil {
		return err
	}
	if err := b.jetstreamSample(ctx, res, n, " (second sample)"); err != nil {
		return err
	}
	if err := b.postgresSample(ctx, res, n, " (second sample)"); err != nil {
		return err
	}
	// The queue is filled again first; that publish is not a sample of the
	// publish ceiling (it has its two: the second is the backfill's fill).
	return b.amqpSample(ctx, res, n, " (second sample of the consume)", false)
}

func (b *bench) jetstreamSample(ctx context.Context, res *Results, n int, sample string) error {
	b.logf("ceiling: JetStream async publish, %d messages%s", n, sample)
	c, err := b.jetstreamCeiling(ctx, n)
	if err != nil {
		return fmt.Errorf("jetstream ceiling: %w", err)
	}
	res.addCeiling(c)
	b.settle(ctx)
	return nil
}

// amqpPlainSample is RabbitMQ's publish ceiling with plain properties: what
// relayd's properties cost RabbitMQ, beside amqpSample's. Half as many
// messages (see defaultOptions): no ratio is taken to it.
func (b *bench) amqpPlainSample(ctx context.Context, res *Results, n int) error {
	b.logf("ceiling: RabbitMQ publish, plain properties, %d messages", n)
	if err := b.withCorner(ctx, cornerSpec{amqp: true}, func(cr *corner) error {
		c, err := b.amqpPublish(ctx, cr, n, false)
		res.addCeiling(c)
		return err
	}); err != nil {
		return fmt.Errorf("rabbitmq publish ceiling (plain): %w", err)
	}
	b.settle(ctx)
	return nil
}

// amqpSample publishes with relayd's properties and fills the queue that the
// consume ceiling then drains: the same messages relayd (and a legacy
// producer) leave in a queue. publishSample: that publish is a sample of the
// publish ceiling too.
func (b *bench) amqpSample(ctx context.Context, res *Results, n int, sample string, publishSample bool) error {
	b.logf("ceiling: RabbitMQ publish, relayd's properties, %d messages; then consume them%s", n, sample)
	if err := b.withCorner(ctx, cornerSpec{amqp: true}, func(cr *corner) error {
		c, err := b.amqpPublish(ctx, cr, n, true)
		if err != nil {
			return fmt.Errorf("rabbitmq publish ceiling%s: %w", sample, err)
		}
		if publishSample {
			res.addCeiling(c)
		}
		b.settle(ctx)
		c, err = b.amqpConsume(ctx, cr, n)
		if err != nil {
			return fmt.Errorf("rabbitmq consume ceiling%s: %w", sample, err)
		}
		res.addCeiling(c)
		return nil
	}); err != nil {
		return err
	}
	b.settle(ctx)
	return nil
}

func (b *bench) postgresSample(ctx context.Context, res *Results, n int, sample string) error {
	b.logf("ceiling: Postgres claim + delete, %d rows%s", n, sample)
	if err := b.withCorner(ctx, cornerSpec{table: true}, func(cr *corner) error {
		c, err := b.postgresCeiling(ctx, cr, n)
		res.addCeiling(c)
		return err
	}); err != nil {
		return fmt.Errorf("postgres ceiling: %w", err)
	}
	b.settle(ctx)
	return nil
}

func (b *bench) commitSample(ctx context.Context, res *Results) error {
	b.logf("ceiling: Postgres single-row commits into the outbox, wake-up on and off")
	if err := b.withCorner(ctx, cornerSpec{table: true}, func(cr *corner) error {
		for _, notify := range []bool{true, false} {
			c, err := b.commitCeiling(ctx, cr, notify)
			if err != nil {
				return err
			}
			res.addCeiling(c)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("postgres commit ceiling: %w", err)
	}
	b.settle(ctx)
	return nil
}

// commitWorkers is how many producers commit at once in the commit ceiling.
const commitWorkers = 16

// commitCeiling has commitWorkers producers commit one-row INSERTs into the
// outbox, as fast as they can for a few seconds: with the wake-up in
// created_at's default (as migrated; no relay waits, so it notifies no one),
// or with a plain now() there.
func (b *bench) commitCeiling(ctx context.Context, cr *corner, notify bool) (Ceiling, error) {
	c := Ceiling{Key: ceilCommitNotify,
		Name: fmt.Sprintf("Postgres single-row INSERT commits into the outbox (the producers' side), %d connections, wake-up on (as migrated), no relay waiting", commitWorkers)}
	tbl := cr.table.Ident()
	if !notify {
		c.Key, c.Name = ceilCommitPlain, "Postgres single-row INSERT commits, the same without the wake-up (created_at DEFAULT now())"
		if _, err := b.pool.Exec(ctx, `ALTER TABLE `+tbl+` ALTER COLUMN created_at SET DEFAULT now()`); err != nil {
			return c, err
		}
	}
	d := 4 * time.Second
	if b.o.Smoke {
		d = time.Second
	}
	snap := takeCPUSnap()
	n, elapsed, err := b.commitFor(ctx, tbl, commitWorkers, d)
	if err != nil {
		return c, err
	}
	c.Messages = n
	c.CPU = cpuSplit(snap, takeCPUSnap(), c.Messages)
	c.measured(c.Messages, elapsed)
	return c, nil
}

func (b *bench) withCorner(ctx context.Context, spec cornerSpec, fn func(*corner) error) error {
	c, err := b.newCorner(ctx, spec)
	if err != nil {
		return err
	}
	defer c.close()
	return fn(c)
}

// settle gives the services a moment to finish background work of the
// previous measurement (queue and stream deletion, flushes) before the next.
func (b *bench) settle(ctx context.Context) {
	if b.o.Smoke {
		backoff.Sleep(ctx, 100*time.Millisecond) // cancellation is seen by the next step
		return
	}
	// At least a second, then until the machine is mostly idle (the
	// services finishing the last step's work: RabbitMQ's message store,
	// Postgres's checkpoint and autovacuum), at most settleMax.
	deadline := time.Now().Add(settleMax)
	backoff.Sleep(ctx, time.Second) // cancellation is seen by the next step
	for ctx.Err() == nil && time.Now().Before(deadline) {
		a := takeCPUSnap()
		backoff.Sleep(ctx, 500*time.Millisecond) // cancellation is seen by the next step
		if busy, ok := machineBusy(a, takeCPUSnap()); !ok || busy < settleBusy {
			return
		}
	}
}

// jetstreamCeiling publishes n messages asynchronously with Nats-Msg-Id to a
// file-storage stream, through relayd's own publisher (internal/jspub), on a
// connection of its own: jsWorkers goroutines publish batches of jsBatch,
// at most jsInFlight waiting for their PubAcks, as relayd's workers do. The
// same client as relayd's: a heavier one (nats.go's PublishMsgAsync, which
// this used until relayd stopped using it) takes CPU from the server it
// measures, and lowers the ceiling relayd is set against.
func (b *bench) jetstreamCeiling(ctx context.Context, n int) (Ceiling, error) {
	c := Ceiling{Key: ceilJetStream, Messages: n,
		Name: fmt.Sprintf("JetStream async publish, Nats-Msg-Id, file storage, %s in flight", thousands(jsInFlight))}
	cr, err := b.newCorner(ctx, cornerSpec{stream: true})
	if err != nil {
		return c, err
	}
	defer cr.close()
	nc, err := nats.Connect(b.o.NATSURL, nats.Name("relayd-bench-ceiling"))
	if err != nil {
		return c, err
	}
	defer nc.Close()
	pub := jspub.New(nc, cr.stream, jsInFlight, 30*time.Second)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	subject := cr.prefix + topic
	stream := []string{cr.stream}

	var next atomic.Int64 // the first message of the next batch
	var mu sync.Mutex
	var failed int
	var firstErr error
	var wg sync.WaitGroup
	snap := takeCPUSnap()
	start := time.Now()
	for range jsWorkers {
		wg.Go(func() {
			for {
				from := int(next.Add(jsBatch)) - jsBatch
				if from >= n {
					return
				}
				msgs := make([]*nats.Msg, min(jsBatch, n-from))
				for i := range msgs {
					msgs[i] = &nats.Msg{Subject: subject, Data: b.payload, Header: nats.Header{
						jetstream.MsgIDHeader: {ids[from+i]}, jetstream.ExpectedStreamHeader: stream}}
				}
				errs := make([]error, len(msgs))
				pub.Publish(ctx, msgs, errs, make([]bool, len(msgs)))
				mu.Lock()
				for _, err := range errs {
					if err != nil {
						if failed++; firstErr == nil {
							firstErr = err
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	c.CPU = cpuSplit(snap, takeCPUSnap(), n)
	if failed > 0 {
		return c, fmt.Errorf("%d publishes failed, first: %w", failed, firstErr)
	}
	c.measured(n, elapsed)
	if got, err := cr.streamMsgs(ctx); err != nil || got != uint64(n) {
		return c, fmt.Errorf("stream holds %d messages, want %d (%v)", got, n, err)
	}
	return c, nil
}

// oneP runs the ceilings' drivers on one P, as relayd runs (cmd/relayd
// procs.go), unless GOMAXPROCS is set; it returns the undo. A ceiling's
// driver should take as little of the machine as it can from the service
// it measures: on two Ps, the consume driver's scheduler spent 0.41
// core-seconds per 10,000 messages against 0.29 on one.
func oneP() (restore func()) {
	if os.Getenv("GOMAXPROCS") != "" {
		return func() {}
	}
	prev := runtime.GOMAXPROCS(1)
	return func() { runtime.GOMAXPROCS(prev) }
}
