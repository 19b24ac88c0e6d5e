package main

import (
	"context"
	"encoding/json"
	"fmt"

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
	r, err := b.runToExit(ctx, cr, n, "backfill", "--queue", cr.queue, "--json")
	if err != nil {
		return err
	}
	var sum backfill.Summary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		return fmt.Errorf("backfill summary: %w\n%s", err, r.stdout)
	}
	if sum.Moved != int64(n) {
		return fmt.Errorf("backfill moved %d of %d messages: %+v\n%s", sum.Moved, n, sum, tail(r.log, 2000))
	}
	if got, err := cr.streamMsgs(ctx); err != nil || got != uint64(n) {
		return fmt.Errorf("stream holds %d messages after the backfill, want %d (%v)", got, n, err)
	}
	bf := &Backfill{
		Messages:         n,
		Moved:            sum.Moved,
		Seconds:          round(r.elapsed.Seconds(), 3),
		Rate:             round(float64(sum.Moved)/r.elapsed.Seconds(), 0),
		ReportedRate:     round(sum.Rate, 0),
		CPUSecondsPer10k: per10k(r.u.CPU, n),
		PeakRSSMiB:       mib(r.u.PeakRSS),
		CPU:              r.split,
	}
	b.logf("  %s msg/s (the backfill's own figure: %s msg/s), %.2f CPU s/10k, peak RSS %.0f MiB",
		thousands(bf.Rate), thousands(bf.ReportedRate), bf.CPUSecondsPer10k, bf.PeakRSSMiB)
	res.Backfill = bf
	return nil
}
