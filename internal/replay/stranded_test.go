package replay

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

// The rows finished without RabbitMQ from a period's start on: the earliest
// JetStream delivery among them moves the window's start, the latest its
// end; those after the period's end are counted.
func TestStranded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table := delivered(t, []deliveredRow{
		{done: ptr(at(61)), nats: ptr(at(20))},                   // stranded at the move: the earliest in the period
		{done: ptr(at(62)), nats: ptr(at(40))},                   // stranded, later
		{done: ptr(at(63)), amqp: ptr(at(10)), nats: ptr(at(5))}, // RabbitMQ has it
		{done: ptr(at(30)), nats: ptr(at(1))},                    // finished before the period
		{done: ptr(at(95)), nats: ptr(at(94))},                   // recorded after it, by a batch claimed in it
		{done: ptr(at(64)), amqp: ptr(at(64))},                   // never on JetStream
	})
	rec := lockRecords(t, pool, table)
	for _, tc := range []struct {
		name         string
		period       phase.Period
		want         Stranded
		wantAfterEnd int64
	}{
		{"an ended period, and the rows after it", phase.Period{Start: at(60), End: at(90)}, Stranded{at(20), at(94)}, 1},
		{"an ongoing period", phase.Period{Start: at(60)}, Stranded{at(20), at(94)}, 0},
		{"a later period", phase.Period{Start: at(80), End: at(85)}, Stranded{at(94), at(94)}, 1},
		{"a period without such rows after it", phase.Period{Start: at(96), End: at(99)}, Stranded{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, afterEnd, err := rec.stranded(ctx, tc.period)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Earliest.Equal(tc.want.Earliest) || !got.Latest.Equal(tc.want.Latest) || afterEnd != tc.wantAfterEnd {
				t.Errorf("stranded = %+v, %d after the end; want %+v, %d", got, afterEnd, tc.want, tc.wantAfterEnd)
			}
		})
	}
}

// plan says when rows finished without RabbitMQ move a default window's
// edges, and when a --since leaves some of them out.
func TestPlanSaysWhereTheStrandedRowsAre(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table := delivered(t, []deliveredRow{
		{done: ptr(at(61)), nats: ptr(at(20))}, // stranded at the move
		{done: ptr(at(95)), nats: ptr(at(94))}, // recorded after the period
	})
	history := []phase.Change{{Phase: phase.Dual, ChangedAt: at(0)}, {Phase: phase.NATS, ChangedAt: at(60)}, {Phase: phase.Dual, ChangedAt: at(90)}}
	for _, tc := range []struct {
		name string
		req  Request
		want Window
		logs []string // what the log says, in order
	}{
		{"the default window", Request{}, Window{Source: "phase", Start: at(19), End: at(95)},
			[]string{"the window starts earlier", "the window reaches them"}},
		{"a --since after a stranded row", Request{Since: at(30)}, Window{Source: "since", Start: at(30)},
			[]string{"before --since, and are not replayed"}},
		{"a --since before them", Request{Since: at(10)}, Window{Source: "since", Start: at(10)}, nil},
		{"a window by sequence", Request{FromSeq: 5}, Window{Source: "seq", FromSeq: 5}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged strings.Builder
			r := &runner{cfg: Config{DB: pool, Table: table, Request: tc.req}, log: slog.New(slog.NewTextHandler(&logged, nil)),
				rec: newRecords(pool, table)}
			got, err := r.plan(ctx, history)
			if err != nil {
				t.Fatal(err)
			}
			if utc(got) != utc(tc.want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, tc.want)
			}
			lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
			if len(tc.logs) == 0 && logged.Len() > 0 || len(tc.logs) > 0 && len(lines) != len(tc.logs) {
				t.Fatalf("logged:\n%s\nwant %d lines: %q", logged.String(), len(tc.logs), tc.logs)
			}
			for i, want := range tc.logs {
				if !strings.Contains(lines[i], want) {
					t.Errorf("log line %d: %s\nwant it to say %q", i, lines[i], want)
				}
			}
		})
	}
}

// The read is a range of the delivered table's primary key: only the
// period's rows, however long the record.
func TestStrandedUsesThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	now := time.Now()
	rows, err := tx.Query(ctx, "EXPLAIN "+outboxsql.For(table).ReplayStranded,
		pgx.StrictStructArgs(outboxsql.ReplayStrandedParams{Start: now.Add(-time.Hour), End: &now}))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		rows.Scan(&line) //nolint:errcheck // read below
		plan.WriteString(line + "\n")
	}
	rows.Close()
	if p := plan.String(); !strings.Contains(p, table.Name+"_delivered_pkey") || !regexp.MustCompile(`Index Cond: \(+done_at >=`).MatchString(p) {
		t.Errorf("ReplayStranded is not a range of %s_delivered_pkey:\n%s", table.Name, p)
	}
}

func ptr[T any](v T) *T { return &v }

// at is minute m of the stranded tests' day.
func at(m int) time.Time {
	return time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC).Add(time.Duration(m) * time.Minute)
}

// deliveredRow is a row of the delivered record: when it was done, and
// when each broker had it (nil: never).
type deliveredRow struct{ done, amqp, nats *time.Time }

// delivered is an outbox of the test's own whose delivered record holds rows.
func delivered(t *testing.T, rows []deliveredRow) (*pgxpool.Pool, schema.Table) {
	t.Helper()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	for i, row := range rows {
		if _, err := pool.Exec(context.Background(), `INSERT INTO `+table.Delivered()+` (done_at, id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent)
			VALUES (@done_at, @id, @message_id, @amqp_delivered_at, @nats_delivered_at, @amqp_sent)`, pgx.NamedArgs{"done_at": row.done, "id": i + 1, "message_id": uuid.NewString(), "amqp_delivered_at": row.amqp, "nats_delivered_at": row.nats, "amqp_sent": row.amqp != nil}); err != nil {
			t.Fatal(err)
		}
	}
	return pool, table
}

// utc is w with its times in UTC, to compare with ==.
func utc(w Window) Window {
	w.Start, w.End = w.Start.UTC(), w.End.UTC()
	return w
}

// The lookups and the stranded rows need the delivered record back to the
// window's start: past RELAY_RETENTION it is gone, and the run says so
// (messages RabbitMQ got are sent again, rows stranded at the move missed).
func TestRunWarnsWhenTheDeliveredRecordIsShorterThanTheWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	start := time.Now().Add(-48 * time.Hour)
	for _, tc := range []struct {
		name      string
		earliest  *time.Time // the delivered record's first done_at; nil: empty
		windowAt  time.Time  // zero: a window by sequence
		wantWarns bool
	}{
		{"the record reaches back", ptr(start.Add(-time.Hour)), start, false},
		{"the record begins after the window's start", ptr(start.Add(time.Hour)), start, true},
		{"the record is empty", nil, start, true},
		{"a window by sequence", ptr(start.Add(time.Hour)), time.Time{}, false},
		{"a window inside the retention", nil, time.Now().Add(-time.Hour), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `DELETE FROM `+table.Delivered()); err != nil {
				t.Fatal(err)
			}
			if tc.earliest != nil {
				if _, err := pool.Exec(ctx, `INSERT INTO `+table.Delivered()+` (done_at, id, message_id, nats_delivered_at, amqp_sent)
					VALUES (@earliest, 1, @message_id, @earliest, false)`, pgx.NamedArgs{"earliest": *tc.earliest, "message_id": uuid.NewString()}); err != nil {
					t.Fatal(err)
				}
			}
			var logged strings.Builder
			r := &runner{cfg: Config{DB: pool, Table: table, Retention: 24 * time.Hour}, log: slog.New(slog.NewTextHandler(&logged, nil)),
				rec: lockRecords(t, pool, table), run: Record{WindowStart: timePtr(tc.windowAt)}}
			if err := r.checkRecordReach(ctx); err != nil {
				t.Fatal(err)
			}
			if warned := strings.Contains(logged.String(), "RELAY_RETENTION"); warned != tc.wantWarns {
				t.Errorf("warned %v, want %v:\n%s", warned, tc.wantWarns, logged.String())
			}
		})
	}
}
