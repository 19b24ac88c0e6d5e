package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/schema"
)

// Record is a run as <table>_replay keeps it: its window, and the sequence
// up to which every message is confirmed by RabbitMQ or skipped.
type Record struct {
	ID          int64      `json:"id"`
	Stream      string     `json:"stream"`
	Exchange    string     `json:"exchange"`
	Request     string     `json:"request"` // Window.Key
	WindowStart *time.Time `json:"window_start,omitempty"`
	WindowEnd   *time.Time `json:"window_end,omitempty"`
	FromSeq     uint64     `json:"from_seq"`
	ToSeq       uint64     `json:"to_seq"`
	Position    uint64     `json:"position"`
	Counts
	StartedAt  time.Time  `json:"started_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Abandoned  bool       `json:"abandoned,omitempty"`
	// StreamCreated is the stream's creation time: the run reads only that
	// stream (nil: recorded before 00017).
	StreamCreated *time.Time `json:"stream_created,omitempty"`
}

// where names the run and how far it got, for its errors.
func (r Record) where() string {
	return fmt.Sprintf("replay run %d, at sequence %d of %d..%d", r.ID, r.Position, r.FromSeq, r.ToSeq)
}

// Counts are what happened to the messages read.
type Counts struct {
	Sent              int64 `json:"sent"`               // confirmed by RabbitMQ (dry run: would be sent)
	SkippedDelivered  int64 `json:"skipped_delivered"`  // the delivered record says RabbitMQ has it
	SkippedBackfilled int64 `json:"skipped_backfilled"` // moved by the backfill from the legacy queue
	SkippedOwed       int64 `json:"skipped_owed"`       // in the outbox or the owed table: RabbitMQ has it, or the relays will send it
	WithoutID         int64 `json:"without_id"`         // no Nats-Msg-Id: skipped
	OtherSubject      int64 `json:"other_subject"`      // not under RELAY_NATS_SUBJECT_PREFIX: skipped
	FailedPermanent   int64 `json:"failed_permanent"`   // RabbitMQ can never take it as it is: logged, passed over
}

func (c *Counts) add(why skip) {
	switch why {
	case send:
		c.Sent++
	case skipDelivered:
		c.SkippedDelivered++
	case skipBackfilled:
		c.SkippedBackfilled++
	case skipOwed:
		c.SkippedOwed++
	case skipWithoutID:
		c.WithoutID++
	case skipOtherSubject:
		c.OtherSubject++
	}
}

func (c *Counts) plus(o Counts) {
	c.Sent += o.Sent
	c.SkippedDelivered += o.SkippedDelivered
	c.SkippedBackfilled += o.SkippedBackfilled
	c.SkippedOwed += o.SkippedOwed
	c.WithoutID += o.WithoutID
	c.OtherSubject += o.OtherSubject
	c.FailedPermanent += o.FailedPermanent
}

// Skipped is every message read and not sent.
func (c Counts) Skipped() int64 {
	return c.SkippedDelivered + c.SkippedBackfilled + c.SkippedOwed + c.WithoutID + c.OtherSubject
}

// records reads and writes the runs of one table; a run's position is
// written on the session holding the replay lock.
type records struct {
	db   *pgxpool.Pool
	q    *outboxsql.Statements
	lock *session
}

func scanRecord(row pgx.Row) (Record, error) {
	var r Record
	var from, to, pos int64
	err := row.Scan(&r.ID, &r.Stream, &r.Exchange, &r.Request, &r.WindowStart, &r.WindowEnd, &from, &to, &pos,
		&r.Sent, &r.SkippedDelivered, &r.SkippedBackfilled, &r.SkippedOwed, &r.WithoutID, &r.OtherSubject,
		&r.FailedPermanent, &r.StartedAt, &r.UpdatedAt, &r.FinishedAt, &r.Abandoned, &r.StreamCreated)
	r.FromSeq, r.ToSeq, r.Position = uint64(max(from, 0)), uint64(max(to, 0)), uint64(max(pos, 0))
	return r, err
}

// one reads the run q returns (args: nil, or its params struct); ok is
// false when there is none.
func (s records) one(ctx context.Context, q string, args ...any) (Record, bool, error) {
	return oneOf(s.db.QueryRow(ctx, q, args...))
}

// oneOf is the run row holds; ok is false when there is none.
func oneOf(row pgx.Row) (Record, bool, error) {
	r, err := scanRecord(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read the replay record: %w", err)
	}
	return r, true, nil
}

func (s records) unfinished(ctx context.Context) (Record, bool, error) {
	return s.one(ctx, s.q.ReplayUnfinished)
}

func (s records) overlapping(ctx context.Context, stream string, from, to uint64) (Record, bool, error) {
	return s.one(ctx, s.q.ReplayOverlap, pgx.StrictStructArgs(outboxsql.ReplayOverlapParams{Stream: stream, FromSeq: int64(from), ToSeq: int64(to)}))
}

func (s records) start(ctx context.Context, r Record) (Record, error) {
	out, err := scanRecord(s.db.QueryRow(ctx, s.q.ReplayStart, pgx.StrictStructArgs(outboxsql.ReplayStartParams{
		Stream: r.Stream, Exchange: r.Exchange, Request: r.Request, WindowStart: r.WindowStart, WindowEnd: r.WindowEnd,
		FromSeq: int64(r.FromSeq), ToSeq: int64(r.ToSeq), StreamCreated: r.StreamCreated,
	})))
	if err != nil {
		return Record{}, fmt.Errorf("record the replay run: %w", err)
	}
	return out, nil
}

// ErrAdvanced: the run's record is not at the position this run last
// recorded. Another replay moved it (this one's session lock was lost with
// its connection), so both may be publishing the same sequences.
var ErrAdvanced = errors.New("another relayd replay advanced this run: stopping")

// advance records that run id, last recorded at expected, is done up to
// position, adding c to its counts; finish closes it. It writes on the lock's
// session, taking the lock again first if that session was lost. again says
// an earlier try of the same write went unanswered: with the lock held,
// finding the run where this write leaves it means that try was recorded.
func (s records) advance(ctx context.Context, id int64, expected, position uint64, c Counts, finish, again bool) error {
	if s.lock.lost() {
		if err := s.lock.retake(ctx); err != nil {
			return fmt.Errorf("take the replay lock again: %w", err)
		}
	}
	tag, err := s.lock.conn.Exec(ctx, s.q.ReplayAdvance, pgx.StrictStructArgs(outboxsql.ReplayAdvanceParams{
		ID: id, Position: int64(position), Sent: c.Sent, SkippedDelivered: c.SkippedDelivered,
		SkippedBackfilled: c.SkippedBackfilled, SkippedOwed: c.SkippedOwed, WithoutID: c.WithoutID,
		OtherSubject: c.OtherSubject, FailedPermanent: c.FailedPermanent, Expected: int64(expected), Finish: finish,
	}))
	if err != nil {
		return fmt.Errorf("record the replay's position: %w", err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	if again {
		run, ok, err := oneOf(s.lock.conn.QueryRow(ctx, s.q.ReplayRun, pgx.StrictStructArgs(outboxsql.ReplayRunParams{ID: id})))
		if err != nil {
			return err
		}
		if ok && run.Position == position && (run.FinishedAt != nil) == finish && !run.Abandoned {
			return nil
		}
	}
	return fmt.Errorf("%w: run %d is no longer unfinished at sequence %d", ErrAdvanced, id, expected)
}

// stranded reads the rows finished without RabbitMQ since period p began,
// and how many of them finished after its end. It reads to the record's
// end: a batch claimed in the period records after it, and so does a relay
// pinned to nats.
func (s records) stranded(ctx context.Context, p phase.Period) (st Stranded, afterEnd int64, err error) {
	var end, earliest, latest *time.Time
	if !p.End.IsZero() {
		end = &p.End
	}
	if err := s.db.QueryRow(ctx, s.q.ReplayStranded, pgx.StrictStructArgs(outboxsql.ReplayStrandedParams{Start: p.Start, End: end})).
		Scan(&earliest, &latest, &afterEnd); err != nil {
		return Stranded{}, 0, fmt.Errorf("read the rows finished without RabbitMQ: %w", err)
	}
	if earliest != nil {
		st = Stranded{Earliest: *earliest, Latest: *latest}
	}
	return st, afterEnd, nil
}

func (s records) abandon(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.q.ReplayAbandon); err != nil {
		return fmt.Errorf("abandon the unfinished replay: %w", err)
	}
	return nil
}

// newRecords reads and writes the runs of table t, the lock not yet taken.
func newRecords(db *pgxpool.Pool, t schema.Table) records {
	q := outboxsql.For(t)
	return records{db: db, q: q, lock: &session{db: db, q: q}}
}

// Latest returns the table's latest run, finished or not; ok is false when
// none was ever recorded.
func Latest(ctx context.Context, db *pgxpool.Pool, table schema.Table) (Record, bool, error) {
	return oneOf(db.QueryRow(ctx, outboxsql.For(table).ReplayLatest))
}
