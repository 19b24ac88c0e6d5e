package main

import (
	"context"
	"fmt"
	"slices"
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
// polling loop only notices the end, up to a tick late.
func (b *bench) burndown(ctx context.Context, targets string, instances, keys int) (bd Burndown, note string, err error) {
	n := b.o.BurnRows
	if keys > 0 {
		n = b.o.BurnKeyedRows
	}
	return b.burndownRun(ctx, burnSpec{targets: targets, instances: instances, rows: n, keys: keys})
}

// burnSpec is one burn-down: the rows it fills the outbox with and the
// relayd processes that drain it.
type burnSpec struct {
	targets   string
	instances int
	rows      int
	keys      int // distinct keys (0: null keys)
	// sampledEvery > 0 gives every row a traceparent header, sampled
	// (flags 01) on every sampledEvery-th row, unsampled (00) on the rest.
	sampledEvery int
	// env is added to each relayd's environment.
	env []string
	// topics > 0 spreads the rows over that many topics (fillTopics).
	topics int
	// setup, when set, makes more beside the corner and returns more
	// environment for each relayd.
	setup func(context.Context, *corner) ([]string, error)
}

// burndownRun runs the burn-down s: see burndown.
func (b *bench) burndownRun(ctx context.Context, s burnSpec) (bd Burndown, note string, err error) {
	targets, instances, n, keys := s.targets, s.instances, s.rows, s.keys
	bd = Burndown{Targets: targets, Instances: instances, Rows: n, Keys: keys}
	ts := strings.Split(targets, ",")
	cr, err := b.newCorner(ctx, cornerSpec{table: true, stream: slices.Contains(ts, "nats"), amqp: slices.Contains(ts, "amqp")})
	if err != nil {
		return bd, "", err
	}
	defer cr.close()
	env := append(cr.relaydEnv(targets), s.env...)
	if s.setup != nil {
		more, err := s.setup(ctx, cr)
		if err != nil {
			return bd, "", err
		}
		env = append(env, more...)
	}
	switch {
	case s.topics > 0:
		err = cr.fillTopics(ctx, n, s.topics)
	case s.sampledEvery > 0:
		err = cr.fillTraced(ctx, n, s.sampledEvery)
	default:
		err = cr.fill(ctx, n, keys)
	}
	if err != nil {
		return bd, "", err
	}

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
	end, err := b.awaitDrained(ctx, procs, pendingSQL(cr, ts), start)
	if err != nil {
		return bd, "", err
	}
	bd.CPU = cpuSplit(snap, takeCPUSnap(), n, procs...)
	cpu, peak, err := stopAll(procs)
	if err != nil {
		return bd, "", err
	}
	procs = nil

	pgEnd, err := b.checkDelivered(ctx, cr, n)
	if err != nil {
		return bd, "", err
	}
	elapsed, err := drainTime(pgStart, pgEnd, end.Sub(start))
	if err != nil {
		return bd, "", err
	}
	bd.Seconds = round(elapsed.Seconds(), 3)
	bd.RowsPerSecond = round(float64(n)/elapsed.Seconds(), 0)
	bd.CPUSecondsPer10k = per10k(cpu, n)
	bd.PeakRSSMiB = mib(peak)
	if problems := brokerProblems(ctx, cr, ts, n); len(problems) > 0 {
		note = fmt.Sprintf("burn-down %s ×%d: %d rows, but %s", targets, instances, n, strings.Join(problems, "; "))
	}
	return bd, note, nil
}

// pendingSQL asks "is anything left?": a row in the outbox, or one the owed
// table's partial indexes hold for an enabled target: cheap enough to ask
// every 100 ms without slowing the relay down. A row is done exactly when no
// enabled target owes it (none is parked here); the exact count is checked
// at the end.
func pendingSQL(cr *corner, targets []string) string {
	tbl := cr.table.Owed()
	owed := []string{`EXISTS (SELECT 1 FROM ` + cr.table.Ident() + `)`}
	for _, t := range targets {
		// Unkeyed and keyed rows have a pending index each.
		for _, k := range []string{"key IS NULL", "key IS NOT NULL"} {
			owed = append(owed, fmt.Sprintf(`EXISTS (SELECT 1 FROM %s WHERE %s AND %[3]s_delivered_at IS NULL AND %[3]s_parked_at IS NULL AND done_at IS NULL)`, tbl, k, t))
		}
	}
	return `SELECT ` + strings.Join(owed, " OR ")
}

// awaitDrained polls pending every 100 ms until nothing is left, and returns
// when it noticed; it fails if a relayd exits or ten minutes pass.
func (b *bench) awaitDrained(ctx context.Context, procs []*proc, pending string, start time.Time) (time.Time, error) {
	deadline := start.Add(10 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
		}
		for _, p := range procs {
			if p.exited() {
				return time.Time{}, fmt.Errorf("relayd exited: %v\n%s", p.err, tail(p.out.String(), 2000))
			}
			p.sampleHWM()
		}
		var left bool
		if err := b.pool.QueryRow(ctx, pending).Scan(&left); err != nil {
			return time.Time{}, err
		}
		if !left {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("rows still pending after %v", time.Since(start).Round(time.Second))
		}
	}
}

// stopAll stops the processes: their CPU time in all, and the highest peak
// RSS of any.
func stopAll(procs []*proc) (cpu time.Duration, peak int64, err error) {
	for _, p := range procs {
		u, err := p.stop()
		if err != nil {
			return 0, 0, err
		}
		cpu += u.CPU
		peak = max(peak, u.PeakRSS)
	}
	return cpu, peak, nil
}

// checkDelivered checks that all n rows left the outbox and the owed table
// for the delivered table, and returns the last one's done_at.
func (b *bench) checkDelivered(ctx context.Context, cr *corner, n int) (time.Time, error) {
	var done, left int
	var pgEnd time.Time
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+cr.table.Delivered()+`), (SELECT count(*) FROM `+cr.table.Ident()+`) + (SELECT count(*) FROM `+cr.table.Owed()+`), (SELECT max(done_at) FROM `+cr.table.Delivered()+`)`).Scan(&done, &left, &pgEnd); err != nil {
		return time.Time{}, err
	}
	if done != n || left != 0 {
		return time.Time{}, fmt.Errorf("%d rows recorded delivered and %d left in the outbox, want %d and 0", done, left, n)
	}
	return pgEnd, nil
}

// brokerProblems says where the brokers do not hold the n messages the
// outbox says they got. A relay publishes a row twice only after a failure
// (docs/design.md, "Never re-sent to a broker that confirmed it"), which a
// benchmark run should not have.
func brokerProblems(ctx context.Context, cr *corner, targets []string, n int) []string {
	var problems []string
	if slices.Contains(targets, "nats") {
		if got, err := cr.streamMsgs(ctx); err != nil || got != uint64(n) {
			problems = append(problems, fmt.Sprintf("stream holds %d messages (%v)", got, err))
		}
	}
	if slices.Contains(targets, "amqp") {
		if got, err := cr.queueDepth(); err != nil || got != n {
			problems = append(problems, fmt.Sprintf("queue holds %d messages (%v)", got, err))
		}
	}
	return problems
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
