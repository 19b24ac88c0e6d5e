package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/replay"
)

// replayRate is the --rate of the measured replay: far above what it
// reaches, so the limiter never waits.
const replayRate = 1_000_000

// replaySource says how the stream got the messages the replay sends.
const replaySource = "relayd run, RELAY_TARGETS=nats, on filled outbox rows, in the nats-only phase"

// replayRun puts ReplayMsgs messages in the stream as the relay does in the
// nats-only phase (phase dual, then nats, in the history; relayd run with
// RELAY_TARGETS=nats on filled rows), sets the phase back to dual, and
// times `relayd replay` publishing them to the legacy exchange: a dry run,
// then the run. The run counts only if the legacy queue then holds each
// message id once.
func (b *bench) replayRun(ctx context.Context, res *Results) error {
	n := b.o.ReplayMsgs
	cr, err := b.newCorner(ctx, cornerSpec{table: true, stream: true, amqp: true})
	if err != nil {
		return err
	}
	defer cr.close()
	if err := cr.setPhase(ctx, phase.Dual, "", false); err != nil {
		return err
	}
	if err := cr.setPhase(ctx, phase.NATS, phase.Dual, true); err != nil {
		return err
	}
	if err := cr.fill(ctx, n, 0); err != nil {
		return err
	}
	ids, err := cr.messageIDs(ctx)
	if err != nil {
		return err
	}
	b.logf("replay: %s messages into the stream by %s", thousands(float64(n)), replaySource)
	if err := b.relayNATSOnly(ctx, cr, n); err != nil {
		return err
	}
	if err := cr.setPhase(ctx, phase.Dual, phase.NATS, true); err != nil {
		return err
	}
	b.settle(ctx)

	b.logf("replay: relayd replay --dry-run, %s messages", thousands(float64(n)))
	dry, err := b.replayProc(ctx, cr, n, "--dry-run")
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	if dry.sum.Read != int64(n) || dry.sum.Sent != int64(n) {
		return fmt.Errorf("dry run read %d and would send %d of %d messages: %+v", dry.sum.Read, dry.sum.Sent, n, dry.sum)
	}
	b.logf("  %s msg/s read, %.2f CPU s/10k", thousands(dry.sum.Rate), per10k(dry.u.CPU, n))
	b.settle(ctx)

	b.logf("replay: relayd replay --rate %s, %s messages", thousands(replayRate), thousands(float64(n)))
	run, err := b.replayProc(ctx, cr, n, "--rate", strconv.Itoa(replayRate))
	if err != nil {
		return err
	}
	if s := run.sum; !s.Finished || s.Failed != 0 || s.Sent != int64(n) {
		return fmt.Errorf("replay sent %d of %d messages (finished %v, failed %d): %+v", s.Sent, n, s.Finished, s.Failed, s)
	}
	got, err := cr.queueIDs(ctx, ids)
	if err != nil {
		return fmt.Errorf("the legacy queue after the replay: %w", err)
	}
	rp := &Replay{
		Messages:         n,
		Source:           replaySource,
		RateFlag:         replayRate,
		Sent:             run.sum.Sent,
		Received:         got,
		Seconds:          round(run.sum.DurationSeconds, 3),
		Rate:             round(run.sum.Rate, 0),
		ProcessSeconds:   round(run.elapsed.Seconds(), 3),
		CPUSecondsPer10k: per10k(run.u.CPU, n),
		PeakRSSMiB:       mib(run.u.PeakRSS),
		CPU:              run.split,
		DryRun: &ReplayDryRun{
			Read:             dry.sum.Read,
			WouldSend:        dry.sum.Sent,
			Seconds:          round(dry.sum.DurationSeconds, 3),
			Rate:             round(dry.sum.Rate, 0),
			CPUSecondsPer10k: per10k(dry.u.CPU, n),
			PeakRSSMiB:       mib(dry.u.PeakRSS),
		},
	}
	b.logf("  %s msg/s (the replay's own figure; %s s from process start to exit), %.2f CPU s/10k, peak RSS %.0f MiB; the queue got each of the %s ids once",
		thousands(rp.Rate), strconv.FormatFloat(rp.ProcessSeconds, 'f', 2, 64), rp.CPUSecondsPer10k, rp.PeakRSSMiB, thousands(float64(got)))
	res.Replay = rp
	return nil
}

// setPhase records phase to as the table's, from phase from (fromSet false:
// none set yet), as `relayd phase set --force` does: no cutover check here.
func (c *corner) setPhase(ctx context.Context, to, from phase.Name, fromSet bool) error {
	before, set, err := phase.Read(ctx, c.b.pool, c.table)
	if err != nil {
		return err
	}
	if set != fromSet || before.Phase != from {
		return fmt.Errorf("set the phase to %s: it is %q (set %v), want %q", to, before.Phase, set, from)
	}
	_, err = phase.Set(ctx, c.b.pool, c.table, phase.Change{Phase: to, ChangedBy: "relayd-bench", Reason: "bench: replay", Forced: to == phase.NATS}, before, set)
	return err
}

// messageIDs is the message ids of the rows in the outbox.
func (c *corner) messageIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := c.b.pool.Query(ctx, `SELECT message_id::text FROM `+c.table.Ident())
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error { ids[id] = true; return nil })
	return ids, err
}

// relayNATSOnly runs one relayd with RELAY_TARGETS=nats until the outbox's n
// rows are done, and checks the stream holds n messages.
func (b *bench) relayNATSOnly(ctx context.Context, cr *corner, n int) error {
	start := time.Now()
	p, err := b.start(cr.relaydEnv("nats"), "run")
	if err != nil {
		return err
	}
	defer p.kill()
	if _, err := b.awaitDrained(ctx, []*proc{p}, pendingSQL(cr, []string{"nats"}), start); err != nil {
		return err
	}
	if _, err := p.stop(); err != nil {
		return err
	}
	if got, err := cr.streamMsgs(ctx); err != nil || got != uint64(n) {
		return fmt.Errorf("stream holds %d messages after the nats-only relay, want %d (%v)", got, n, err)
	}
	return nil
}

// replayed is one `relayd replay` process and its summary.
type replayed struct {
	oneShot
	sum replay.Summary
}

// replayProc runs `relayd replay --json` with args to its exit.
func (b *bench) replayProc(ctx context.Context, cr *corner, n int, args ...string) (replayed, error) {
	var r replayed
	var err error
	if r.oneShot, err = b.runToExit(ctx, cr, n, append([]string{"replay", "--json"}, args...)...); err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(r.stdout), &r.sum); err != nil {
		return r, fmt.Errorf("replay summary: %w\n%s", err, r.stdout)
	}
	return r, nil
}

// queueIDs consumes the corner's queue and checks that it holds each id of
// ids once and nothing else; it returns how many ids it got.
func (c *corner) queueIDs(ctx context.Context, ids map[string]bool) (int, error) {
	depth, err := c.queueDepth()
	if err != nil {
		return 0, err
	}
	if depth != len(ids) {
		return 0, fmt.Errorf("%d messages in the queue, want %d", depth, len(ids))
	}
	ch, err := c.b.amqpConn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Qos(consumePrefetch, 0, false); err != nil {
		return 0, err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, c.queue, "relayd-bench", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	seen := make(map[string]bool, len(ids))
	idle := time.NewTimer(consumeIdleBudget)
	defer idle.Stop()
	for got := 0; got < depth; got++ {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return 0, fmt.Errorf("consumer closed after %d of %d", got, depth)
			}
			switch {
			case !ids[d.MessageId]:
				return 0, fmt.Errorf("message id %q is not one of the outbox's", d.MessageId)
			case seen[d.MessageId]:
				return 0, fmt.Errorf("message id %s twice", d.MessageId)
			}
			seen[d.MessageId] = true
			if (got+1)%consumeAckEvery == 0 || got+1 == depth {
				if err := d.Ack(true); err != nil {
					return 0, err
				}
			}
			idle.Reset(consumeIdleBudget)
		case <-idle.C:
			return 0, fmt.Errorf("no delivery for %v after %d of %d", consumeIdleBudget, got, depth)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return len(seen), nil
}
