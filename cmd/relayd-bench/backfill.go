package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/relayd/relayd/backfill"
)

// backfillRun fills a legacy queue with BackfillMsgs messages as relayd
// would have published them (the fill is a second sample of the RabbitMQ
// publish ceiling) and times `relayd backfill --queue` moving them into the
// stream, from process start to exit.
func (b *bench) backfillRun(ctx context.Context, res *Results) error {
	n := b.o.BackfillMsgs
	cr, err := b.newCorner(ctx, cornerSpec{table: true, stream: true, amqp: true})
	if err != nil {
		return err
	}
	defer cr.close()

	b.logf("backfill: filling the legacy queue with %s messages (RabbitMQ publish ceiling, second sample)", thousands(float64(n)))
	restore := oneP()
	c, err := b.amqpPublish(ctx, cr, n, true)
	restore()
	if err != nil {
		return fmt.Errorf("fill the legacy queue: %w", err)
	}
	res.addCeiling(c)
	b.checkpoint(ctx)
	b.settle(ctx)

	b.logf("backfill: relayd backfill --queue, %s messages", thousands(float64(n)))
	// No HTTP server for the backfill, unless -relayd-env asks for one
	// (RELAY_PPROF with a RELAY_METRICS_ADDR, to profile it): the last of
	// duplicate variables wins.
	env := cr.relaydEnv("")
	for i, e := range env {
		if strings.HasPrefix(e, "RELAY_METRICS_ADDR=") {
			env[i] = "RELAY_METRICS_ADDR="
			break
		}
	}
	snap := takeCPUSnap()
	start := time.Now()
	p, err := b.start(env, "backfill", "--queue", cr.queue, "--json")
	if err != nil {
		return err
	}
	defer p.kill()
	for !p.exited() {
		p.sampleHWM()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	split := cpuSplit(snap, takeCPUSnap(), n)
	u, err := p.stop()
	if err != nil {
		return err
	}
	if split != nil {
		split.Relayd = per10k(u.CPU, n) // the process is gone from /proc by now
	}
	var sum backfill.Summary
	if err := json.Unmarshal([]byte(p.stdout.String()), &sum); err != nil {
		return fmt.Errorf("backfill summary: %w\n%s", err, p.stdout.String())
	}
	if sum.Moved != int64(n) {
		return fmt.Errorf("backfill moved %d of %d messages: %+v\n%s", sum.Moved, n, sum, tail(p.out.String(), 2000))
	}
	if got, err := cr.streamMsgs(ctx); err != nil || got != uint64(n) {
		return fmt.Errorf("stream holds %d messages after the backfill, want %d (%v)", got, n, err)
	}
	bf := &Backfill{
		Messages:         n,
		Moved:            sum.Moved,
		Seconds:          round(elapsed.Seconds(), 3),
		Rate:             round(float64(sum.Moved)/elapsed.Seconds(), 0),
		ReportedRate:     round(sum.Rate, 0),
		CPUSecondsPer10k: per10k(u.CPU, n),
		PeakRSSMiB:       mib(u.PeakRSS),
		CPU:              split,
	}
	b.logf("  %s msg/s (the backfill's own figure: %s msg/s), %.2f CPU s/10k, peak RSS %.0f MiB",
		thousands(bf.Rate), thousands(bf.ReportedRate), bf.CPUSecondsPer10k, bf.PeakRSSMiB)
	res.Backfill = bf
	return nil
}
