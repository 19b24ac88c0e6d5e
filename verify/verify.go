// Package verify reconciles the outbox's record of what it delivered with
// what the JetStream stream actually holds.
//
// The relay marks a row delivered only after a PubAck, and the backfill
// records an id only after one, so the outbox table and its _backfilled
// table are a ledger the stream can be audited against: an id the ledger
// says was delivered but the stream does not hold was lost (a stream purged
// or restored from an old snapshot, a message deleted, the wrong stream), and
// an id the stream holds at two sequences was stored twice (a republish after
// the duplicate window had passed, another publisher). Those are the two
// failures that matter before and after a cutover, and neither shows up in
// any broker metric.
//
// The audit must work on a window of millions of messages without holding
// them in memory: the stream is scanned with an ordered, headers-only
// consumer and each (Nats-Msg-Id, sequence) pair is copied into a Postgres
// temporary table in batches; the comparisons are SQL joins. Go memory is
// O(batch + examples) whatever the window.
package verify

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// Defaults for the zero values of [Config].
const (
	DefaultWindow    = 24 * time.Hour
	DefaultSlack     = time.Minute
	DefaultExamples  = 10
	DefaultBatchSize = 10_000
	// maxSeqs bounds the sequences listed for one duplicated id.
	maxSeqs = 20
)

// ErrInvalidConfig is wrapped by the error [Run] returns for a bad [Config].
var ErrInvalidConfig = errors.New("verify: invalid config")

// ErrNoTable is returned by [Run] when the outbox table does not exist.
var ErrNoTable = errors.New("verify: no outbox table")

// Config is what [Run] checks, and against what.
type Config struct {
	// DB is the database of the outbox table. Required. Run holds one of its
	// connections for the whole run (its session temporary tables live
	// there); it never writes to the outbox tables.
	DB *pgxpool.Pool
	// Table is the outbox table; its _delivered table (rows delivered to
	// every target, which leave the outbox) is read with it, and its
	// _backfilled table is checked too when it exists. Required.
	Table schema.Table
	// JS reaches the stream. Required.
	JS jetstream.JetStream
	// Stream is the JetStream stream the outbox publishes to. Required.
	Stream string
	// Since and Until bound the window: rows whose nats_delivered_at (and
	// backfilled ids whose moved_at) is in [Since, Until] are checked.
	// Default Until: now; default Since: Until - 24h.
	Since, Until time.Time
	// Slack widens the stream scan on both sides, [Since-Slack,
	// Until+Slack] by the stream's timestamps, because the clocks of
	// Postgres, the relay and the NATS server differ, and a message is
	// stored a little before its delivery is recorded. Default 1m.
	//
	// The scan also starts one duplicate window (the stream's) earlier: a
	// publish repeated after a crash gets a Duplicate PubAck and is recorded
	// then, up to that window after the message was stored.
	Slack time.Duration
	// Examples is how many examples each finding lists. Default (0): 10;
	// negative: none, counts only.
	Examples int
	// BatchSize is how many (id, sequence) pairs are copied to Postgres at
	// once. Default 10,000.
	BatchSize int
	// IdleTimeout is how long the scan waits for the next message before it
	// asks the server whether anything is left to read. Default 5s.
	IdleTimeout time.Duration
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// Report is what [Run] found. OK reports whether nothing is missing or
// duplicated.
type Report struct {
	Table  string    `json:"table"`
	Stream string    `json:"stream"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	// SlackSeconds is Config.Slack.
	SlackSeconds float64 `json:"slack_seconds"`
	Scan         Scan    `json:"scan"`
	// Outbox checks rows the relay recorded delivered to JetStream
	// (nats_delivered_at in the window).
	Outbox Check `json:"outbox"`
	// Backfill checks ids `relayd backfill` moved (moved_at in the window).
	Backfill Check `json:"backfill"`
	// StreamDuplicates lists every Nats-Msg-Id found at more than one
	// sequence in the scanned range, whatever published it.
	StreamDuplicates Duplicates `json:"stream_duplicates"`
	// Duration is how long the run took.
	Duration        time.Duration `json:"-"`
	DurationSeconds float64       `json:"duration_seconds"`
}

// Scan describes the part of the stream that was read.
type Scan struct {
	// From and To are the stream timestamps the scan covered at most:
	// Since - Slack - the stream's duplicate window, and Until + Slack.
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// LastSeqAtStart is the stream's last sequence when the scan began;
	// the scan reads no further.
	LastSeqAtStart uint64 `json:"last_seq_at_start"`
	// FirstSeq and LastSeq are the first and last sequence read (0: none).
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// Messages is how many messages were read; WithoutMsgID how many of
	// them had no Nats-Msg-Id (counted, not an error, not checked).
	Messages     int64 `json:"messages"`
	WithoutMsgID int64 `json:"without_msg_id"`
}

// Check is the outcome for one ledger (the outbox or the backfill record).
type Check struct {
	// Skipped says why the check was not made (an unmigrated _backfilled
	// table); empty when it was.
	Skipped string `json:"skipped,omitempty"`
	// Checked is how many ids the ledger records in the window.
	Checked int64 `json:"checked"`
	// Missing ids are recorded as delivered but are not in the scanned range.
	Missing         int64     `json:"missing"`
	MissingExamples []Missing `json:"missing_examples"`
	// Duplicated ids are in the scanned range more than once.
	Duplicated         int64       `json:"duplicated"`
	DuplicatedExamples []Duplicate `json:"duplicated_examples"`
}

// Missing is one id recorded as delivered and not found in the stream.
type Missing struct {
	ID string `json:"id"`
	// At is when the ledger recorded it (nats_delivered_at or moved_at).
	At time.Time `json:"at"`
}

// Duplicate is one Nats-Msg-Id stored at more than one sequence.
type Duplicate struct {
	ID string `json:"id"`
	// Copies is how many times it is in the scanned range.
	Copies int64 `json:"copies"`
	// Seqs are its stream sequences, in order (the first 20 at most).
	Seqs []uint64 `json:"seqs"`
}

// Duplicates is the stream-wide duplicate finding.
type Duplicates struct {
	// IDs is how many distinct ids are stored more than once; Extra how
	// many copies beyond the first there are in all.
	IDs      int64       `json:"ids"`
	Extra    int64       `json:"extra_copies"`
	Examples []Duplicate `json:"examples"`
}

// OK reports whether nothing is missing or duplicated.
func (r Report) OK() bool {
	return r.Outbox.Missing == 0 && r.Outbox.Duplicated == 0 &&
		r.Backfill.Missing == 0 && r.Backfill.Duplicated == 0 &&
		r.StreamDuplicates.IDs == 0
}

func (c *Config) applyDefaults(now time.Time) error {
	switch {
	case c.DB == nil:
		return fmt.Errorf("%w: DB is required", ErrInvalidConfig)
	case c.JS == nil:
		return fmt.Errorf("%w: JS is required", ErrInvalidConfig)
	case c.Stream == "":
		return fmt.Errorf("%w: Stream is required", ErrInvalidConfig)
	case c.Table.Name == "":
		return fmt.Errorf("%w: Table is required", ErrInvalidConfig)
	case c.Slack < 0:
		return fmt.Errorf("%w: Slack %s is negative", ErrInvalidConfig, c.Slack)
	case c.BatchSize < 0:
		return fmt.Errorf("%w: BatchSize %d is negative", ErrInvalidConfig, c.BatchSize)
	}
	if c.Until.IsZero() {
		c.Until = now
	}
	if c.Since.IsZero() {
		c.Since = c.Until.Add(-DefaultWindow)
	}
	if c.Until.Before(c.Since) {
		return fmt.Errorf("%w: until %s is before since %s", ErrInvalidConfig, c.Until.Format(time.RFC3339), c.Since.Format(time.RFC3339))
	}
	if c.Slack == 0 {
		c.Slack = DefaultSlack
	}
	switch {
	case c.Examples == 0:
		c.Examples = DefaultExamples
	case c.Examples < 0:
		c.Examples = 0
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Temporary tables, in the session of the one connection a run holds.
const (
	tmpStream   = "pg_temp.relayd_verify_stream"
	tmpOutbox   = "pg_temp.relayd_verify_outbox"
	tmpBackfill = "pg_temp.relayd_verify_backfill"
	tmpDups     = "pg_temp.relayd_verify_dups"
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
	stream, err := cfg.JS.Stream(ctx, cfg.Stream)
	if err != nil {
		return rep, fmt.Errorf("stream %s: %w", cfg.Stream, err)
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
	if err := r.scan(ctx, stream); err != nil {
		return rep, err
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
		if _, err := r.conn.Exec(ctx, "DROP TABLE IF EXISTS "+tmpStream+", "+tmpOutbox+", "+tmpBackfill+", "+tmpDups); err != nil {
			r.conn.Hijack().Close(ctx) //nolint:errcheck // closing is the cleanup
			return
		}
	}
	r.conn.Release()
}

func (r *run) createTables(ctx context.Context) error {
	r.dirty = true
	_, err := r.conn.Exec(ctx, `
DROP TABLE IF EXISTS `+tmpStream+`, `+tmpOutbox+`, `+tmpBackfill+`, `+tmpDups+`;
CREATE TEMP TABLE `+tmpStream+` (msg_id text NOT NULL, seq bigint NOT NULL);
CREATE TEMP TABLE `+tmpOutbox+` (msg_id text NOT NULL, at timestamptz NOT NULL);
CREATE TEMP TABLE `+tmpBackfill+` (msg_id text NOT NULL, at timestamptz NOT NULL)`)
	if err != nil {
		return fmt.Errorf("create temporary tables: %w", err)
	}
	return nil
}

// snapshotLedgers copies the window's ids from the outbox, the delivered
// table and the backfill record into temporary tables, server side.
func (r *run) snapshotLedgers(ctx context.Context) error {
	t := r.cfg.Table
	sql := outboxsql.For(t)
	// An id a producer inserted again after its first row was delivered
	// counts once (outboxsql's VerifyOutbox).
	tag, err := r.conn.Exec(ctx, `INSERT INTO `+tmpOutbox+` (msg_id, at) `+sql.VerifyOutbox, r.cfg.Since, r.cfg.Until)
	if isUndefinedTable(err) {
		return fmt.Errorf("%w: %s (run `relayd migrate`)", ErrNoTable, t)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", t, err)
	}
	r.rep.Outbox.Checked = tag.RowsAffected()

	var exists bool
	if err := r.conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.Backfilled()).Scan(&exists); err != nil {
		return fmt.Errorf("look for %s_backfilled: %w", t, err)
	}
	if !exists {
		r.rep.Backfill.Skipped = fmt.Sprintf("no table %s_backfilled: run `relayd migrate`", t)
		return nil
	}
	tag, err = r.conn.Exec(ctx, `INSERT INTO `+tmpBackfill+` (msg_id, at) `+sql.VerifyBackfill, r.cfg.Since, r.cfg.Until)
	if err != nil {
		return fmt.Errorf("read %s_backfilled: %w", t, err)
	}
	r.rep.Backfill.Checked = tag.RowsAffected()
	return nil
}

// scan reads the stream from Since-Slack-Duplicates until a message stored after
// Until+Slack, the last sequence at the start of the scan, or the end of the
// stream, and copies every (Nats-Msg-Id, sequence) pair to Postgres.
func (r *run) scan(ctx context.Context, stream jetstream.Stream) error {
	sc := &r.rep.Scan
	info, err := stream.Info(ctx) // fresh: CachedInfo is as old as the handle
	if err != nil {
		return fmt.Errorf("stream %s info: %w", r.cfg.Stream, err)
	}
	sc.LastSeqAtStart = info.State.LastSeq
	sc.From = r.cfg.Since.Add(-r.cfg.Slack - info.Config.Duplicates)
	log := r.cfg.Logger.With("stream", r.cfg.Stream)
	if info.State.Msgs == 0 || info.State.LastTime.Before(sc.From) {
		log.Info("verify: nothing to scan", "stream_messages", info.State.Msgs, "last_time", info.State.LastTime)
		return nil
	}
	from := sc.From
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &from,
		HeadersOnly:   true,
		// The server removes it soon if this process dies mid-scan.
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("stream %s: create ordered consumer: %w", r.cfg.Stream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(min(r.cfg.BatchSize, 2000)))
	if err != nil {
		return fmt.Errorf("stream %s: consume: %w", r.cfg.Stream, err)
	}
	stopOnCancel := context.AfterFunc(ctx, it.Stop)
	defer func() {
		stopOnCancel()
		it.Stop()
		if ci := cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r.cfg.JS.DeleteConsumer(dctx, r.cfg.Stream, ci.Name) //nolint:errcheck // it expires by itself
			cancel()
		}
	}()
	log.Info("verify: scanning stream", "from", sc.From, "to", sc.To, "last_seq", sc.LastSeqAtStart)

	batch := newPairs(r.cfg.BatchSize)
	flush := func() error {
		if batch.len() == 0 {
			return nil
		}
		if _, err := r.conn.CopyFrom(ctx, pgx.Identifier{"pg_temp", "relayd_verify_stream"}, []string{"msg_id", "seq"}, batch.source()); err != nil {
			return fmt.Errorf("copy stream ids to postgres: %w", err)
		}
		batch.reset()
		return nil
	}
	nextLog := time.Now().Add(5 * time.Second)
	for {
		msg, err := it.Next(jetstream.NextMaxWait(r.cfg.IdleTimeout))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, nats.ErrTimeout) {
				// Nothing for a while: done if the consumer has nothing
				// left (the messages up to the last sequence were deleted
				// meanwhile), else keep waiting.
				ci, ierr := cons.Info(ctx)
				if ierr != nil {
					return fmt.Errorf("stream %s: consumer info: %w", r.cfg.Stream, ierr)
				}
				if ci.NumPending == 0 {
					break
				}
				continue
			}
			return fmt.Errorf("stream %s: read: %w", r.cfg.Stream, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("stream %s: message metadata: %w", r.cfg.Stream, err)
		}
		seq := meta.Sequence.Stream
		if meta.Timestamp.After(sc.To) || seq > sc.LastSeqAtStart {
			break
		}
		if sc.FirstSeq == 0 {
			sc.FirstSeq = seq
		}
		sc.LastSeq = seq
		sc.Messages++
		if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
			batch.add(id, int64(seq))
		} else {
			sc.WithoutMsgID++
		}
		if batch.len() >= r.cfg.BatchSize {
			if err := flush(); err != nil {
				return err
			}
		}
		if now := time.Now(); now.After(nextLog) {
			nextLog = now.Add(5 * time.Second)
			log.Info("verify: scanning", "seq", seq, "last_seq", sc.LastSeqAtStart, "messages", sc.Messages)
		}
		if seq >= sc.LastSeqAtStart || meta.NumPending == 0 {
			break
		}
	}
	return flush()
}

// compare indexes the scanned pairs and runs the checks in SQL.
func (r *run) compare(ctx context.Context) error {
	_, err := r.conn.Exec(ctx, `
CREATE INDEX ON `+tmpStream+` (msg_id);
ANALYZE `+tmpStream+`;
ANALYZE `+tmpOutbox+`;
ANALYZE `+tmpBackfill+`;
CREATE TEMP TABLE `+tmpDups+` AS
	SELECT msg_id, count(*) AS copies, (array_agg(seq ORDER BY seq))[1:`+fmt.Sprint(maxSeqs)+`] AS seqs, min(seq) AS first_seq
	FROM `+tmpStream+` GROUP BY msg_id HAVING count(*) > 1;
ANALYZE `+tmpDups+`;`)
	if err != nil {
		return fmt.Errorf("index scanned ids: %w", err)
	}
	d := &r.rep.StreamDuplicates
	if err := r.conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(copies - 1), 0) FROM `+tmpDups).Scan(&d.IDs, &d.Extra); err != nil {
		return fmt.Errorf("count duplicates: %w", err)
	}
	if d.Examples, err = r.duplicates(ctx, `SELECT msg_id, copies, seqs FROM `+tmpDups+` ORDER BY first_seq LIMIT $1`); err != nil {
		return err
	}
	if err := r.check(ctx, tmpOutbox, &r.rep.Outbox); err != nil {
		return fmt.Errorf("check outbox: %w", err)
	}
	if r.rep.Backfill.Skipped == "" {
		if err := r.check(ctx, tmpBackfill, &r.rep.Backfill); err != nil {
			return fmt.Errorf("check backfill: %w", err)
		}
	}
	return nil
}

// check compares one ledger snapshot with the scanned pairs.
func (r *run) check(ctx context.Context, ledger string, c *Check) error {
	if c.Checked == 0 {
		return nil
	}
	const missingWhere = ` l WHERE NOT EXISTS (SELECT 1 FROM ` + tmpStream + ` s WHERE s.msg_id = l.msg_id)`
	if err := r.conn.QueryRow(ctx, `SELECT count(*) FROM `+ledger+missingWhere).Scan(&c.Missing); err != nil {
		return fmt.Errorf("count missing: %w", err)
	}
	if c.Missing > 0 && r.cfg.Examples > 0 {
		rows, err := r.conn.Query(ctx, `SELECT l.msg_id, l.at FROM `+ledger+missingWhere+` ORDER BY l.at, l.msg_id LIMIT $1`, r.cfg.Examples)
		if err != nil {
			return fmt.Errorf("list missing: %w", err)
		}
		c.MissingExamples, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Missing, error) {
			var m Missing
			err := row.Scan(&m.ID, &m.At)
			return m, err
		})
		if err != nil {
			return fmt.Errorf("list missing: %w", err)
		}
	}
	const dupFrom = ` FROM ` + tmpDups + ` d WHERE EXISTS (SELECT 1 FROM %s l WHERE l.msg_id = d.msg_id)`
	if err := r.conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*)`+dupFrom, ledger)).Scan(&c.Duplicated); err != nil {
		return fmt.Errorf("count duplicated: %w", err)
	}
	if c.Duplicated > 0 {
		var err error
		c.DuplicatedExamples, err = r.duplicates(ctx, fmt.Sprintf(`SELECT d.msg_id, d.copies, d.seqs`+dupFrom+` ORDER BY d.first_seq LIMIT $1`, ledger))
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *run) duplicates(ctx context.Context, query string) ([]Duplicate, error) {
	out := []Duplicate{}
	if r.cfg.Examples == 0 {
		return out, nil
	}
	rows, err := r.conn.Query(ctx, query, r.cfg.Examples)
	if err != nil {
		return nil, fmt.Errorf("list duplicates: %w", err)
	}
	out, err = pgx.AppendRows(out, rows, func(row pgx.CollectableRow) (Duplicate, error) {
		var d Duplicate
		var seqs []int64
		if err := row.Scan(&d.ID, &d.Copies, &seqs); err != nil {
			return d, err
		}
		d.Seqs = make([]uint64, len(seqs))
		for i, s := range seqs {
			d.Seqs[i] = uint64(s)
		}
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list duplicates: %w", err)
	}
	return out, nil
}

// pairs is one batch of (id, sequence) pairs, reused from batch to batch.
type pairs struct {
	ids  []string
	seqs []int64
	i    int
	row  [2]any
}

func newPairs(n int) *pairs {
	return &pairs{ids: make([]string, 0, n), seqs: make([]int64, 0, n)}
}

func (p *pairs) add(id string, seq int64) {
	p.ids = append(p.ids, id)
	p.seqs = append(p.seqs, seq)
}

func (p *pairs) len() int { return len(p.ids) }

func (p *pairs) reset() {
	clear(p.ids) // let the strings go
	p.ids, p.seqs = p.ids[:0], p.seqs[:0]
}

// source returns the batch as a pgx.CopyFromSource.
func (p *pairs) source() pgx.CopyFromSource {
	p.i = -1
	return p
}

func (p *pairs) Next() bool { p.i++; return p.i < len(p.ids) }

// Values reuses one slice: pgx encodes a row before asking for the next.
func (p *pairs) Values() ([]any, error) {
	p.row[0], p.row[1] = p.ids[p.i], p.seqs[p.i]
	return p.row[:], nil
}

func (p *pairs) Err() error { return nil }

// isUndefinedTable reports a Postgres "relation does not exist".
func isUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}
