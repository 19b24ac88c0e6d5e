// Package verify reconciles the outbox's record of what it delivered with
// what the JetStream stream actually holds.
//
// The relay marks a row delivered only after a PubAck, and the backfill
// records an id only after one, so the outbox's _owed, _delivered and
// _backfilled tables are a ledger the stream can be audited against: an id
// the ledger says was delivered but the stream does not hold was lost (a
// stream purged or restored from an old snapshot, a message deleted, the
// wrong stream), and an id the stream holds at two sequences was stored
// twice (a republish after the duplicate window had passed, another
// publisher). Those are the two failures that matter before and after a
// cutover, and neither shows up in any broker metric.
//
// The audit must work on a window of millions of messages without holding
// them in memory: the stream is scanned with an ordered, headers-only
// consumer and each (Nats-Msg-Id, sequence) pair is copied into a Postgres
// temporary table in batches; the comparisons are SQL joins. Go memory is
// O(batch + examples) whatever the window.
package verify

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
)

// Run reconciles the window and returns what it found. An error means the
// check could not be made; findings are in the Report (see [Report.OK]).
//
// Order matters: the ledgers' ids are snapshotted into temporary tables
// first, then the stream's last sequence is read, then the stream is
// scanned. Every id in the snapshot was acked by JetStream before it was
// recorded, so before the scan's last sequence was read: a row delivered
// while the run is going on cannot be reported missing.
func Run(ctx context.Context, cfg Config) (Report, error) {
	start := time.Now()
	if err := cfg.applyDefaults(start); err != nil {
		return Report{}, err
	}
	rep := Report{
		Table: cfg.Table.String(), Stream: cfg.Stream,
		Since: cfg.Since, Until: cfg.Until, SlackSeconds: cfg.Slack.Seconds(),
		Scan:             Scan{To: cfg.Until.Add(cfg.Slack)},
		Outbox:           Check{MissingExamples: []Missing{}, DuplicatedExamples: []Duplicate{}},
		Backfill:         Check{MissingExamples: []Missing{}, DuplicatedExamples: []Duplicate{}},
		StreamDuplicates: Duplicates{Examples: []Duplicate{}},
	}
	for _, name := range cfg.MoreStreams {
		rep.MoreScans = append(rep.MoreScans, StreamScan{Stream: name, Scan: Scan{To: rep.Scan.To}})
	}
	conn, err := cfg.DB.Acquire(ctx)
	if err != nil {
		return rep, fmt.Errorf("acquire connection: %w", err)
	}
	r := &run{cfg: cfg, conn: conn, rep: &rep}
	defer r.release()

	if err := r.createTables(ctx); err != nil {
		return rep, err
	}
	if err := r.snapshotLedgers(ctx); err != nil {
		return rep, err
	}
	if err := r.scan(ctx, cfg.Stream, &rep.Scan); err != nil {
		return rep, err
	}
	for i := range rep.MoreScans {
		if err := r.scan(ctx, rep.MoreScans[i].Stream, &rep.MoreScans[i].Scan); err != nil {
			return rep, err
		}
	}
	if err := r.compare(ctx); err != nil {
		return rep, err
	}
	rep.Duration = time.Since(start)
	rep.DurationSeconds = rep.Duration.Seconds()
	cfg.Logger.Info("verify done", "messages", rep.Scan.Messages, "ok", rep.OK(), "duration", rep.Duration.Round(time.Millisecond).String())
	return rep, nil
}

type run struct {
	cfg  Config
	conn *pgxpool.Conn
	rep  *Report
	// dirty is set once temporary tables exist, until they are dropped.
	dirty bool
}

// release drops the temporary tables and returns the connection; when the
// drop fails, the connection is closed instead, taking them with it, so that
// no other user of the pool inherits them.
func (r *run) release() {
	if r.dirty {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := r.conn.Exec(ctx, outboxsql.VerifyFor(r.cfg.Table).Drop); err != nil {
			r.conn.Hijack().Close(ctx) //nolint:errcheck // closing is the cleanup
			return
		}
	}
	r.conn.Release()
}
