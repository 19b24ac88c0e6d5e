package replay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// --restart forgets what the abandoned run settled: when it had settled
// sequences, the warning says how many and that a window over them sends
// them again.
func TestRestartWarnsOfWhatItSendsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table, rec := testRecords(t)
	for _, tc := range []struct {
		name     string
		position uint64 // the run covers 101..400
		want     string // "": no such warning
	}{
		{"settled some", 250, "had settled 150 sequences (101..250): a window over them sends what it sent of them again"},
		{"settled all", 400, "had settled 300 sequences (101..400)"},
		{"settled none", 100, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `DELETE FROM `+table.Side("replay")); err != nil {
				t.Fatal(err)
			}
			run, err := rec.start(ctx, Record{Stream: "S", Exchange: "X", Request: "from-seq=101", FromSeq: 101, ToSeq: 400})
			if err != nil {
				t.Fatal(err)
			}
			if tc.position > 100 {
				if err := rec.advance(ctx, run.ID, 100, tc.position, Counts{Sent: int64(tc.position - 100)}, false, false); err != nil {
					t.Fatal(err)
				}
				run.Position = tc.position
			}
			var logged strings.Builder
			r := &runner{cfg: Config{DB: pool, Table: table, Restart: true}, log: slog.New(slog.NewTextHandler(&logged, nil)), rec: rec}
			if err := r.abandon(ctx, run); err != nil {
				t.Fatal(err)
			}
			if got := logged.String(); (tc.want == "") == strings.Contains(got, "had settled") || !strings.Contains(got, tc.want) {
				t.Errorf("warning:\n%s\nwant one with %q", got, tc.want)
			}
			if _, ok, err := rec.unfinished(ctx); err != nil || ok {
				t.Errorf("after abandon: unfinished %v, %v; want none", ok, err)
			}
		})
	}
}

// An unfinished run's sequences are its stream's, and its messages go to
// its exchange: a rerun configured with another stream or exchange would
// read other messages at those sequences, or send the rest elsewhere. It is
// refused, naming both; the same configuration resumes, on the same stream:
// not one re-created under its name.
func TestResumeKeepsTheRunsStreamAndExchange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table, rec := testRecords(t)
	created := time.Date(2026, 11, 2, 9, 0, 0, 123456789, time.UTC)
	if _, err := rec.start(ctx, Record{Stream: "OUTBOX", Exchange: "outbox", Request: "from-seq=1", FromSeq: 1, ToSeq: 9, StreamCreated: &created}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stream, exchange string
		created                time.Time // the stream's now
		want                   []string  // "": resumed
	}{
		{"the same", "OUTBOX", "outbox", created, nil},
		{"another stream", "OTHER", "outbox", created, []string{`stream "OUTBOX"`, `"OTHER"`, "RELAY_NATS_STREAM"}},
		{"another exchange", "OUTBOX", "legacy", created, []string{`exchange "outbox"`, `"legacy"`, "RELAY_AMQP_EXCHANGE"}},
		{"the stream re-created", "OUTBOX", "outbox", created.Add(time.Hour), []string{"stream OUTBOX was re-created", "--restart", "run 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{cfg: Config{DB: pool, Table: table, Stream: tc.stream, Exchange: tc.exchange}, log: slog.New(slog.DiscardHandler), rec: rec}
			_, err := r.choose(ctx, createdStream{created: tc.created})
			if tc.want == nil {
				if err != nil || !r.sum.Resumed {
					t.Fatalf("choose: %v, resumed %v; want the run resumed", err, r.sum.Resumed)
				}
				return
			}
			if err == nil {
				t.Fatalf("choose resumed run %d (stream %s, exchange %s) with stream %s, exchange %s", r.run.ID, r.run.Stream, r.run.Exchange, tc.stream, tc.exchange)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("choose: %q does not name %s", err, s)
				}
			}
		})
	}
}
