package verify_test

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/verify"
	"github.com/relayd/relayd/schema"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check outlives a closed pool briefly.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// fixture is one test's outbox table (in its own schema) and stream.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	table  schema.Table
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	prefix string
}

// setup creates the test's table and a memory stream whose duplicate window
// is dupWindow.
func setup(t *testing.T, dupWindow time.Duration) *fixture {
	t.Helper()
	f := &fixture{t: t, pool: testenv.Pool(t)}
	f.table = testenv.Outbox(t, f.pool)
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(nc.Close)
	if f.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	id := testenv.Name("verify")
	f.name, f.prefix = strings.ToUpper(id), id+"."
	ctx := context.Background()
	f.stream, err = f.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: f.name, Subjects: []string{f.prefix + ">"}, Storage: jetstream.MemoryStorage, Duplicates: dupWindow,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() { f.js.DeleteStream(context.Background(), f.name) }) //nolint:errcheck // cleanup
	return f
}

// publish stores one message with Nats-Msg-Id id (none when empty) and
// returns its sequence; it fails the test if JetStream dropped it as a
// duplicate.
func (f *fixture) publish(id string) uint64 {
	f.t.Helper()
	ack := f.publishAck(id)
	if ack.Duplicate {
		f.t.Fatalf("publish %q: dropped as a duplicate", id)
	}
	return ack.Sequence
}

func (f *fixture) publishAck(id string) *jetstream.PubAck {
	f.t.Helper()
	var opts []jetstream.PublishOpt
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	ack, err := f.js.PublishMsg(context.Background(), &nats.Msg{Subject: f.prefix + "orders", Data: []byte("{}")}, opts...)
	if err != nil {
		f.t.Fatalf("publish %q: %v", id, err)
	}
	return ack
}

// republish stores id again under a new sequence once the stream's
// duplicate window has passed, and returns that sequence.
func (f *fixture) republish(id string) uint64 {
	f.t.Helper()
	var seq uint64
	testenv.Eventually(f.t, 10*time.Second, func() bool {
		ack := f.publishAck(id)
		seq = ack.Sequence
		return !ack.Duplicate
	}, "%s still dropped as a duplicate", id)
	return seq
}

// delivered records ids as delivered to JetStream at at and still owed to
// RabbitMQ: inserted, then moved to the owed table as a batch would.
func (f *fixture) delivered(at time.Time, ids ...string) {
	f.t.Helper()
	var rows []int64
	err := f.pool.QueryRow(context.Background(), `WITH r AS (INSERT INTO `+f.table.Ident()+`
		(message_id, topic, payload) SELECT id, 'orders', '\x7b7d' FROM unnest(@message_ids::uuid[]) AS u(id) RETURNING id)
		SELECT array_agg(id) FROM r`, pgx.NamedArgs{"message_ids": ids}).Scan(&rows)
	if err != nil {
		f.t.Fatalf("record delivered: %v", err)
	}
	// A literal, as pgx would send at: to the microsecond, truncated.
	lit := at.Truncate(time.Microsecond).UTC().Format(time.RFC3339Nano)
	testenv.SetState(f.t, f.pool, f.table, `nats_delivered_at = '`+lit+`'::timestamptz`, `id = ANY(@ids::bigint[])`, pgx.NamedArgs{"ids": rows})
}

// done records ids as delivered to every target — delivered to JetStream
// at at — the way the relay does: in the delivered table, not the outbox.
func (f *fixture) done(at time.Time, ids ...string) {
	f.t.Helper()
	_, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.table.Delivered()+`
		(id, message_id, amqp_delivered_at, nats_delivered_at, done_at)
		SELECT nextval(pg_get_serial_sequence(@table, 'id')), id, @at, @at, @at FROM unnest(@message_ids::uuid[]) AS u(id)`, pgx.NamedArgs{"message_ids": ids, "at": at, "table": f.table.String()})
	if err != nil {
		f.t.Fatalf("record done: %v", err)
	}
}

// backfilled records ids as moved by the backfill at at.
func (f *fixture) backfilled(at time.Time, ids ...string) {
	f.t.Helper()
	_, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.table.Backfilled()+`
		(message_id, queue, moved_at) SELECT id, 'legacy', @at FROM unnest(@message_ids::text[]) AS u(id)`, pgx.NamedArgs{"message_ids": ids, "at": at})
	if err != nil {
		f.t.Fatalf("record backfilled: %v", err)
	}
}

func (f *fixture) verify(cfg verify.Config) verify.Report {
	f.t.Helper()
	cfg.DB, cfg.Table, cfg.JS, cfg.Stream = f.pool, f.table, f.js, f.name
	cfg.Logger = slog.New(slog.NewTextHandler(f.t.Output(), nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := verify.Run(ctx, cfg)
	if err != nil {
		f.t.Fatalf("verify: %v", err)
	}
	return rep
}

func newID() string { return uuid.NewString() }

// publishIDs publishes n new ids and returns them with their sequences.
func (f *fixture) publishIDs(n int) ([]string, []uint64) {
	f.t.Helper()
	ids, seqs := make([]string, n), make([]uint64, n)
	for i := range ids {
		ids[i] = newID()
		seqs[i] = f.publish(ids[i])
	}
	return ids, seqs
}

func findings(r verify.Report) string {
	return fmt.Sprintf("outbox %+v, backfill %+v, stream duplicates %+v, scan %+v", r.Outbox, r.Backfill, r.StreamDuplicates, r.Scan)
}

// Every recorded id in the stream once: no findings.
func TestClean(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	ids, _ := f.publishIDs(50)
	f.delivered(time.Now(), ids[:25]...) // still owed to RabbitMQ
	f.done(time.Now(), ids[25:]...)
	legacy := []string{"legacy-1", "legacy-2", "B2F1D3F4-0000-4000-8000-000000000000"} // as the legacy producer spelled it
	for _, id := range legacy {
		f.publish(id)
	}
	f.backfilled(time.Now(), legacy...)

	r := f.verify(verify.Config{})
	if !r.OK() || r.Outbox.Checked != 50 || r.Backfill.Checked != 3 || r.Scan.Messages != 53 || r.Scan.WithoutMsgID != 0 {
		t.Fatalf("want 50 outbox and 3 backfilled ids checked, 53 messages, no findings; got %s", findings(r))
	}
	if r.Scan.FirstSeq != 1 || r.Scan.LastSeq != 53 || r.Scan.LastSeqAtStart != 53 {
		t.Errorf("scan covered %d..%d (last at start %d), want 1..53", r.Scan.FirstSeq, r.Scan.LastSeq, r.Scan.LastSeqAtStart)
	}
	if r.Since.After(r.Until) || r.Until.Sub(r.Since) != verify.DefaultWindow {
		t.Errorf("default window %s..%s, want the last 24h", r.Since, r.Until)
	}
	// The scan's consumer is gone, not left to expire.
	if info, err := f.stream.Info(context.Background()); err != nil || info.State.Consumers != 0 {
		t.Errorf("consumers left on the stream: %v (%v)", info.State.Consumers, err)
	}
}

// A recorded message deleted from the stream, and a backfilled id that never
// reached it, are reported missing by id.
func TestMissing(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	ids, seqs := f.publishIDs(10)
	at := time.Now()
	f.delivered(at, ids[:3]...)
	f.done(at, ids[3:]...) // the one deleted below among them
	f.publish("legacy-ok")
	f.backfilled(at, "legacy-ok", "legacy-lost")
	if err := f.stream.DeleteMsg(context.Background(), seqs[3]); err != nil {
		t.Fatal(err)
	}

	r := f.verify(verify.Config{})
	if r.OK() || r.Outbox.Checked != 10 || r.Outbox.Missing != 1 || len(r.Outbox.MissingExamples) != 1 || r.Outbox.MissingExamples[0].ID != ids[3] {
		t.Fatalf("want %s missing from the outbox check; got %s", ids[3], findings(r))
	}
	if got := r.Outbox.MissingExamples[0].At; got.Sub(at).Abs() > time.Millisecond {
		t.Errorf("missing example at %s, want the recorded %s", got, at)
	}
	if r.Backfill.Missing != 1 || len(r.Backfill.MissingExamples) != 1 || r.Backfill.MissingExamples[0].ID != "legacy-lost" {
		t.Errorf("want legacy-lost missing from the backfill check; got %+v", r.Backfill)
	}
	if r.Outbox.Duplicated != 0 || r.StreamDuplicates.IDs != 0 {
		t.Errorf("no duplicates expected; got %s", findings(r))
	}

	// Counts only: the same figures without examples.
	r = f.verify(verify.Config{Examples: -1})
	if r.Outbox.Missing != 1 || len(r.Outbox.MissingExamples) != 0 {
		t.Errorf("Examples -1: want the count without examples; got %+v", r.Outbox)
	}
}

// An outbox id stored again under a new sequence once the duplicate window
// had passed is reported with both sequences.
func TestDuplicated(t *testing.T) {
	t.Parallel()
	f := setup(t, 100*time.Millisecond)
	ids, seqs := f.publishIDs(5)
	f.delivered(time.Now(), ids...)
	second := f.republish(ids[2])

	r := f.verify(verify.Config{})
	want := verify.Duplicate{ID: ids[2], Copies: 2, Seqs: []uint64{seqs[2], second}}
	if r.OK() || r.Outbox.Duplicated != 1 || len(r.Outbox.DuplicatedExamples) != 1 || !equalDup(r.Outbox.DuplicatedExamples[0], want) {
		t.Fatalf("want %+v duplicated in the outbox check; got %s", want, findings(r))
	}
	if r.StreamDuplicates.IDs != 1 || r.StreamDuplicates.Extra != 1 || !equalDup(r.StreamDuplicates.Examples[0], want) {
		t.Errorf("want %+v among stream duplicates; got %+v", want, r.StreamDuplicates)
	}
	if r.Outbox.Missing != 0 {
		t.Errorf("nothing missing expected; got %+v", r.Outbox)
	}
}

// Duplicates among messages that did not come through the outbox (other
// publishers, backfilled) are found too; messages without Nats-Msg-Id are
// counted and left alone.
func TestDuplicatesNotFromOutboxAndNoMsgID(t *testing.T) {
	t.Parallel()
	f := setup(t, 100*time.Millisecond)
	ids, _ := f.publishIDs(3)
	f.delivered(time.Now(), ids...)
	first := f.publish("other-publisher-1")
	f.publish("")
	f.publish("")
	moved := f.publish("legacy-7")
	f.backfilled(time.Now(), "legacy-7")
	second := f.republish("other-publisher-1")
	third := f.republish("other-publisher-1")
	movedAgain := f.republish("legacy-7")
	f.publish("")

	r := f.verify(verify.Config{})
	if r.OK() || r.Outbox.Duplicated != 0 || r.Outbox.Missing != 0 {
		t.Fatalf("want stream duplicates only; got %s", findings(r))
	}
	if r.Scan.WithoutMsgID != 3 || r.Scan.Messages != 3+2+3+1+1+1 {
		t.Errorf("want 11 messages, 3 without Nats-Msg-Id; got %+v", r.Scan)
	}
	d := r.StreamDuplicates
	wantOther := verify.Duplicate{ID: "other-publisher-1", Copies: 3, Seqs: []uint64{first, second, third}}
	wantMoved := verify.Duplicate{ID: "legacy-7", Copies: 2, Seqs: []uint64{moved, movedAgain}}
	if d.IDs != 2 || d.Extra != 3 || len(d.Examples) != 2 || !equalDup(d.Examples[0], wantOther) || !equalDup(d.Examples[1], wantMoved) {
		t.Errorf("want %+v and %+v (3 extra copies); got %+v", wantOther, wantMoved, d)
	}
	if r.Backfill.Duplicated != 1 || !equalDup(r.Backfill.DuplicatedExamples[0], wantMoved) {
		t.Errorf("want legacy-7 duplicated in the backfill check; got %+v", r.Backfill)
	}

	r = f.verify(verify.Config{Examples: 1})
	if r.StreamDuplicates.IDs != 2 || len(r.StreamDuplicates.Examples) != 1 {
		t.Errorf("Examples 1: want 2 ids, 1 example; got %+v", r.StreamDuplicates)
	}
}

func equalDup(a, b verify.Duplicate) bool {
	return a.ID == b.ID && a.Copies == b.Copies && slices.Equal(a.Seqs, b.Seqs)
}

// Only rows recorded inside [since, until] are checked, and the stream is
// scanned no further than until + slack.
func TestWindowBounds(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	now := time.Now()
	old := newID() // delivered 2h ago; its message is gone (not in the stream)
	f.delivered(now.Add(-2*time.Hour), old)
	movedOld := "legacy-old"
	f.backfilled(now.Add(-2*time.Hour), movedOld)
	ids, _ := f.publishIDs(4)
	f.delivered(now, ids...)

	r := f.verify(verify.Config{Since: now.Add(-time.Hour)})
	if !r.OK() || r.Outbox.Checked != 4 || r.Backfill.Checked != 0 {
		t.Fatalf("since 1h ago: want the 4 recent rows checked, nothing found; got %s", findings(r))
	}

	r = f.verify(verify.Config{Since: now.Add(-3 * time.Hour)})
	if r.Outbox.Checked != 5 || r.Outbox.Missing != 1 || r.Outbox.MissingExamples[0].ID != old || r.Backfill.Missing != 1 {
		t.Fatalf("since 3h ago: want the old row and the old backfilled id missing; got %s", findings(r))
	}

	// Until 30 minutes ago: the recent rows are not checked, and the scan
	// stops at the first message stored after until + slack.
	r = f.verify(verify.Config{Since: now.Add(-3 * time.Hour), Until: now.Add(-30 * time.Minute)})
	if r.Outbox.Checked != 1 || r.Outbox.Missing != 1 || r.Scan.Messages != 0 {
		t.Fatalf("until 30m ago: want only the old row checked, no message scanned; got %s", findings(r))
	}

	// Recorded 40s after it was stored (a retried publish acked as a
	// Duplicate), well past the slack: still found, because the scan starts
	// one duplicate window (1m here) before since - slack.
	late := newID()
	f.publish(late)
	f.delivered(now.Add(40*time.Second), late)
	r = f.verify(verify.Config{Since: now.Add(30 * time.Second), Until: now.Add(time.Minute), Slack: time.Second})
	if !r.OK() || r.Outbox.Checked != 1 || !r.Scan.From.Before(now) {
		t.Fatalf("late record: want it checked and found; got %s", findings(r))
	}
}

func TestEmptyStreamAndErrors(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Minute)
	r := f.verify(verify.Config{})
	if !r.OK() || r.Scan.Messages != 0 || r.Outbox.Checked != 0 {
		t.Fatalf("empty: want nothing; got %s", findings(r))
	}
	// Recorded but the stream is empty: missing, without waiting for messages.
	id := newID()
	f.delivered(time.Now(), id)
	r = f.verify(verify.Config{})
	if r.Outbox.Missing != 1 || r.Outbox.MissingExamples[0].ID != id {
		t.Fatalf("want %s missing; got %s", id, findings(r))
	}

	ctx := context.Background()
	if _, err := verify.Run(ctx, verify.Config{DB: f.pool, Table: f.table, JS: f.js, Stream: f.name,
		Since: time.Now(), Until: time.Now().Add(-time.Hour)}); !errors.Is(err, verify.ErrInvalidConfig) {
		t.Errorf("until before since: got %v, want ErrInvalidConfig", err)
	}
	if _, err := verify.Run(ctx, verify.Config{DB: f.pool, Table: f.table, JS: f.js, Stream: "NO_SUCH_STREAM"}); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("no stream: got %v, want ErrStreamNotFound", err)
	}
	if _, err := verify.Run(ctx, verify.Config{DB: f.pool, Table: schema.Table{Schema: f.table.Schema, Name: "nope"}, JS: f.js, Stream: f.name}); !errors.Is(err, verify.ErrNoTable) {
		t.Errorf("no table: got %v, want ErrNoTable", err)
	}
	// The temporary tables go with each run, failed or not: a one-session
	// pool is still usable and its session holds none of them.
	pc, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	f.pool = one
	f.verify(verify.Config{})
	if _, err := verify.Run(ctx, verify.Config{DB: one, Table: schema.Table{Schema: f.table.Schema, Name: "nope"}, JS: f.js, Stream: f.name}); err == nil {
		t.Fatal("no table: want an error")
	}
	var n int
	if err := one.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'relayd_verify_%' AND pg_table_is_visible(oid)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("temporary tables left in the pooled session: %d (%v)", n, err)
	}
}

// msgID is the id of message i of a run, the same in Go and in SQL
// (md5(prefix || i)::uuid).
func msgID(prefix string, i int) string {
	s := md5.Sum([]byte(prefix + fmt.Sprint(i)))
	return fmt.Sprintf("%x-%x-%x-%x-%x", s[0:4], s[4:6], s[6:8], s[8:10], s[10:])
}

// 200,000 messages: the Go heap does not grow with the window, because the
// ids go to Postgres, not to maps.
func TestBoundedMemory(t *testing.T) {
	const n = 200_000
	f := setup(t, time.Minute)
	// Setup only (200,000 publishes and rows): generous, since make test
	// runs this beside the integration suite's relays on two cores, where
	// it has taken over a minute. What the test asserts is memory.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	prefix := testenv.Name("m")
	start := time.Now()
	for i := range n {
		msg := &nats.Msg{Subject: f.prefix + "orders", Data: []byte("x")}
		_, err := f.js.PublishMsgAsync(msg, jetstream.WithMsgID(msgID(prefix, i)))
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// The server is behind (a busy machine): let it catch up.
			select {
			case <-f.js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publishes not acknowledged in time")
			}
			_, err = f.js.PublishMsgAsync(msg, jetstream.WithMsgID(msgID(prefix, i)))
		}
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	select {
	case <-f.js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishes not acked in time")
	}
	if info, err := f.stream.Info(ctx); err != nil || info.State.Msgs != n {
		t.Fatalf("stream holds %v messages (%v), want %d", info.State.Msgs, err, n)
	}
	// Straight into the owed table, ids from the outbox's sequence as a
	// batch's move keeps them: half the writes of inserting, then SetState.
	if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.table.Owed()+` (id, message_id, topic, payload, nats_delivered_at)
		SELECT nextval(pg_get_serial_sequence(@table, 'id')), md5(@prefix || i)::uuid, 'orders', '\x78', now()
		FROM generate_series(0, @count - 1) AS i`, pgx.NamedArgs{"prefix": prefix, "count": n, "table": f.table.String()}); err != nil {
		t.Fatal(err)
	}
	t.Logf("setup: %d messages published and recorded in %s", n, time.Since(start).Round(time.Millisecond))

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	start = time.Now()
	r := f.verify(verify.Config{})
	took := time.Since(start)
	close(stop)
	<-sampled
	runtime.GC()
	runtime.ReadMemStats(&ms)
	after := ms.HeapInuse

	if !r.OK() || r.Outbox.Checked != n || r.Scan.Messages != n {
		t.Fatalf("want %d checked and scanned, no findings; got %s", n, findings(r))
	}
	const mb = 1 << 20
	growth := int64(peak.Load()) - int64(before)
	t.Logf("verify of %d messages: %s (%.0f msg/s); heap in use %.1f MB before, peak +%.1f MB, +%.1f MB after GC",
		n, took.Round(time.Millisecond), n/took.Seconds(), float64(before)/mb, float64(growth)/mb, (float64(after)-float64(before))/mb)
	// Holding the ids in maps would take ~30 MB at this size.
	if growth > 16*mb {
		t.Errorf("heap grew by %.1f MB at peak, want under 16 MB", float64(growth)/mb)
	}
	if int64(after)-int64(before) > 4*mb {
		t.Errorf("heap kept %.1f MB after the run, want under 4 MB", (float64(after)-float64(before))/mb)
	}
}
