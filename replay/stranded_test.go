package replay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/phase"
)

// The rows a period strands are those that finished in it without RabbitMQ;
// the earliest JetStream delivery among them is the window's start.
func TestStranded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for i, row := range []struct {
		done, amqp, nats *time.Time
	}{
		{done: ptr(at(61)), nats: ptr(at(20))},                   // stranded at the move: the earliest in the period
		{done: ptr(at(62)), nats: ptr(at(40))},                   // stranded, later
		{done: ptr(at(63)), amqp: ptr(at(10)), nats: ptr(at(5))}, // RabbitMQ has it
		{done: ptr(at(30)), nats: ptr(at(1))},                    // finished before the period
		{done: ptr(at(95)), nats: ptr(at(2))},                    // finished after it
		{done: ptr(at(90).Add(time.Second)), nats: ptr(at(3))},   // by a cleanup whose statement began before the move back committed
		{done: ptr(at(64)), amqp: ptr(at(64))},                   // never on JetStream
	} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table.Delivered()+` (done_at, id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent)
			VALUES ($1, $2, $3, $4, $5, $6)`, row.done, i+1, uuid.NewString(), row.amqp, row.nats, row.amqp != nil); err != nil {
			t.Fatal(err)
		}
	}
	rec := lockRecords(t, pool, table)
	for _, tc := range []struct {
		name   string
		period phase.Period
		want   time.Time // zero: none
	}{
		{"an ended period, and the Margin after it", phase.Period{Start: at(60), End: at(90)}, at(3)},
		{"an ended period", phase.Period{Start: at(60), End: at(80)}, at(20)},
		{"an ongoing period reads to now", phase.Period{Start: at(60)}, at(2)},
		{"a period without such rows", phase.Period{Start: at(0), End: at(29)}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := rec.stranded(ctx, tc.period)
			if err != nil {
				t.Fatal(err)
			}
			if ok != !tc.want.IsZero() || !got.Equal(tc.want) {
				t.Errorf("stranded = %s, %v; want %s", got, ok, tc.want)
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
	rows, err := tx.Query(ctx, "EXPLAIN "+outboxsql.For(table).ReplayStranded, time.Now().Add(-time.Hour), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		rows.Scan(&line) //nolint:errcheck // read below
		plan.WriteString(line + "\n")
	}
	rows.Close()
	if p := plan.String(); !strings.Contains(p, table.Name+"_delivered_pkey") || !strings.Contains(p, "Index Cond: ((done_at >=") {
		t.Errorf("ReplayStranded is not a range of %s_delivered_pkey:\n%s", table.Name, p)
	}
}

func ptr[T any](v T) *T { return &v }

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
					VALUES ($1, 1, $2, $1, false)`, *tc.earliest, uuid.NewString()); err != nil {
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
