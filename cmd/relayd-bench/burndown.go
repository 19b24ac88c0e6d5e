package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

func (b *bench) burndowns(ctx context.Context, res *Results) error {
	type run struct {
		targets string
		keys    int
	}
	var runs []run
	for _, t := range b.o.BurnTargets {
		runs = append(runs, run{t, 0})
	}
	for _, t := range b.o.BurnKeyed {
		runs = append(runs, run{t, b.o.BurnKeys})
	}
	for _, r := range runs {
		counts := b.o.BurnInstances
		if r.keys > 0 && len(counts) > 1 {
			// Keyed runs with the first count only: they are the slowest
			// of the bench, which must finish in minutes.
			counts = counts[:1]
		}
		for _, instances := range counts {
			keyed := ""
			if r.keys > 0 {
				keyed = fmt.Sprintf(" over %s keys", thousands(float64(r.keys)))
			}
			rows := b.o.BurnRows
			if r.keys > 0 {
				rows = b.o.BurnKeyedRows
			}
			b.logf("burn-down: %s rows%s, RELAY_TARGETS=%s, %d instance(s)", thousands(float64(rows)), keyed, r.targets, instances)
			bd, note, err := b.burndown(ctx, r.targets, instances, r.keys)
			if err != nil {
				return fmt.Errorf("%s ×%d%s: %w", r.targets, instances, keyed, err)
			}
			b.logf("  %s rows/s, %.2f CPU s/10k rows, peak RSS %.0f MiB", thousands(bd.RowsPerSecond), bd.CPUSecondsPer10k, bd.PeakRSSMiB)
			res.Burndown = append(res.Burndown, bd)
			if note != "" {
				res.Notes = append(res.Notes, note)
			}
			b.settle(ctx)
		}
	}
	return nil
}

// burndown fills an outbox with BurnRows rows of null keys, or BurnKeyedRows
// rows of keys distinct keys taking turns, starts instances relayd processes
// at their default settings and times them from start until every row is
// done.
//
// Both ends of the time come from Postgres's clock: the start just before
// the processes start, the end the last row's done_at in the delivered
// table (which relayd stamps with clock_timestamp() as it records it): the
// loop below only notices the end, up to a tick late.
func (b *bench) burndown(ctx context.Context, targets string, instances, keys int) (bd Burndown, note string, err error) {
	n := b.o.BurnRows
	if keys > 0 {
		n = b.o.BurnKeyedRows
	}
	bd = Burndown{Targets: targets, Instances: instances, Rows: n, Keys: keys}
	ts := strings.Split(targets, ",")
	has := func(t string) bool {
		for _, x := range ts {
			if x == t {
				return true
			}
		}
		return false
	}
	cr, err := b.newCorner(ctx, cornerSpec{table: true, stream: has("nats"), amqp: has("amqp")})
	if err != nil {
		return bd, "", err
	}
	defer cr.close()
	if err := cr.fill(ctx, n, keys); err != nil {
		return bd, "", err
	}

	// "Is anything left?" through the relay's own partial indexes of rows
	// owed to each target: cheap enough to ask every 100 ms without
	// slowing the relay down. A row is done (deleted, its id recorded as
	// delivered) exactly when no enabled target owes it — none is parked
	// here; the exact count is checked once at the end.
	tbl := cr.table.Ident()
	var owed []string
	for _, t := range ts {
		// Unkeyed and keyed rows have a pending index each.
		for _, k := range []string{"key IS NULL", "key IS NOT NULL"} {
			owed = append(owed, fmt.Sprintf(`EXISTS (SELECT 1 FROM %s WHERE %s AND %[3]s_delivered_at IS NULL AND %[3]s_parked_at IS NULL AND done_at IS NULL)`, tbl, k, t))
		}
	}
	pendingSQL := `SELECT ` + strings.Join(owed, " OR ")

	env := cr.relaydEnv(targets)
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	var pgStart time.Time
	if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&pgStart); err != nil {
		return bd, "", err
	}
	snap := takeCPUSnap()
	start := time.Now()
	for range instances {
		p, err := b.start(env, "run")
		if err != nil {
			return bd, "", err
		}
		procs = append(procs, p)
	}
	deadline := start.Add(10 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var end time.Time
	for end.IsZero() {
		select {
		case <-ctx.Done():
			return bd, "", ctx.Err()
		case <-tick.C:
		}
		for _, p := range procs {
			if p.exited() {
				return bd, "", fmt.Errorf("relayd exited: %v\n%s", p.err, tail(p.out.String(), 2000))
			}
			p.sampleHWM()
		}
		var pending bool
		if err := b.pool.QueryRow(ctx, pendingSQL).Scan(&pending); err != nil {
			return bd, "", err
		}
		if !pending {
			end = time.Now()
			bd.CPU = cpuSplit(snap, takeCPUSnap(), n, procs...)
		} else if time.Now().After(deadline) {
			return bd, "", fmt.Errorf("rows still pending after %v", time.Since(start).Round(time.Second))
		}
	}

	var cpu time.Duration
	var peak int64
	for _, p := range procs {
		u, err := p.stop()
		if err != nil {
			return bd, "", err
		}
		cpu += u.CPU
		peak = max(peak, u.PeakRSS)
	}
	procs = nil

	// Every row delivered to every target leaves the outbox for the
	// delivered table.
	var done, left int
	var pgEnd time.Time
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+cr.table.Delivered()+`), (SELECT count(*) FROM `+tbl+`), (SELECT max(done_at) FROM `+cr.table.Delivered()+`)`).Scan(&done, &left, &pgEnd); err != nil {
		return bd, "", err
	}
	if done != n || left != 0 {
		return bd, "", fmt.Errorf("%d rows recorded delivered and %d left in the outbox, want %d and 0", done, left, n)
	}
	elapsed, err := drainTime(pgStart, pgEnd, end.Sub(start))
	if err != nil {
		return bd, "", err
	}
	bd.Seconds = round(elapsed.Seconds(), 3)
	bd.RowsPerSecond = round(float64(n)/elapsed.Seconds(), 0)
	bd.CPUSecondsPer10k = per10k(cpu, n)
	bd.PeakRSSMiB = mib(peak)

	// The brokers hold what the outbox says they got. A relay may publish a
	// row to RabbitMQ twice only after a failure (docs/design.md: "Never re-sent
	// …"), which a benchmark run should not have: say so if it did.
	var problems []string
	if has("nats") {
		if got, err := cr.streamMsgs(ctx); err != nil || got != uint64(n) {
			problems = append(problems, fmt.Sprintf("stream holds %d messages (%v)", got, err))
		}
	}
	if has("amqp") {
		if got, err := cr.queueDepth(); err != nil || got != n {
			problems = append(problems, fmt.Sprintf("queue holds %d messages (%v)", got, err))
		}
	}
	if len(problems) > 0 {
		note = fmt.Sprintf("burn-down %s ×%d: %d rows, but %s", targets, instances, n, strings.Join(problems, "; "))
	}
	return bd, note, nil
}

// drainTime is how long a burn-down took by Postgres's clock, from the start
// to the last row's done_at; seen is the time the bench took to notice the
// end, by its own clock, which can only be later. A drain time outside
// (0, seen + 1 s] means the clock or the record is wrong.
func drainTime(pgStart, lastDone time.Time, seen time.Duration) (time.Duration, error) {
	d := lastDone.Sub(pgStart)
	if d <= 0 || d > seen+time.Second {
		return 0, fmt.Errorf("the last row was done %v after the start by Postgres's clock, but noticed %v after it", d, seen)
	}
	return d, nil
}
