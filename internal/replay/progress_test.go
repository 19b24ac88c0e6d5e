package replay

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// The position advances only from the one this run last recorded: a run
// whose lock was lost learns that another replay moved the record, and
// stops at once rather than try again.
func TestAdvanceComparesThePosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table, rec := testRecords(t)
	for _, tc := range []struct {
		name     string
		expected uint64 // the run's record is at 10
		finished bool   // another replay finished or abandoned it
		wantErr  error
		wantPos  int64
	}{
		{"at the recorded position", 10, false, nil, 20},
		{"stale: another replay advanced it", 4, false, ErrAdvanced, 10},
		{"ahead of the record", 15, false, ErrAdvanced, 10},
		{"finished meanwhile", 10, true, ErrAdvanced, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := freshRun(t, table, rec)
			if err := rec.advance(ctx, run.ID, 0, 10, Counts{Sent: 10}, false, false); err != nil {
				t.Fatal(err)
			}
			if tc.finished {
				if err := rec.abandon(ctx); err != nil {
					t.Fatal(err)
				}
			}
			run.Position = tc.expected
			r := &runner{cfg: Config{DB: pool, Table: table}, log: slog.New(slog.DiscardHandler), rec: rec, run: run}
			start := time.Now()
			err := r.record(tc.expected, 20, Counts{Sent: 10}, false)
			if !errors.Is(err, tc.wantErr) || (err != nil && tc.wantErr == nil) {
				t.Fatalf("record: %v, want %v", err, tc.wantErr)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("record took %s: it tried again after a lost compare", took)
			}
			var pos, sent int64
			if err := pool.QueryRow(ctx, `SELECT position, sent FROM `+table.Side("replay")+` WHERE id = @run_id`, pgx.NamedArgs{"run_id": run.ID}).Scan(&pos, &sent); err != nil {
				t.Fatal(err)
			}
			if pos != tc.wantPos || sent != tc.wantPos {
				t.Errorf("record at %d, %d sent; want %d, %d", pos, sent, tc.wantPos, tc.wantPos)
			}
		})
	}
}

// A try of a write whose earlier try went unanswered finds that try
// recorded: it is this run's own write, not another replay's.
func TestAdvanceAfterAnUnansweredTry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table, rec := testRecords(t)
	for _, tc := range []struct {
		name    string
		finish  bool
		other   uint64 // another replay then moved the run here (0: none)
		abandon bool
		again   bool
		wantErr error
	}{
		{"recorded, tried again", false, 0, false, true, nil},
		{"recorded and finished, tried again", true, 0, false, true, nil},
		{"recorded, then another replay moved it", false, 30, false, true, ErrAdvanced},
		{"recorded, then abandoned", false, 0, true, true, ErrAdvanced},
		{"not a retry", false, 0, false, false, ErrAdvanced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := freshRun(t, table, rec)
			// The first try: recorded, its answer lost.
			if err := rec.advance(ctx, run.ID, 0, 20, Counts{Sent: 20}, tc.finish, false); err != nil {
				t.Fatal(err)
			}
			if tc.other > 0 {
				if err := rec.advance(ctx, run.ID, 20, tc.other, Counts{Sent: 10}, false, false); err != nil {
					t.Fatal(err)
				}
			}
			if tc.abandon {
				if err := rec.abandon(ctx); err != nil {
					t.Fatal(err)
				}
			}
			err := rec.advance(ctx, run.ID, 0, 20, Counts{Sent: 20}, tc.finish, tc.again)
			if !errors.Is(err, tc.wantErr) || (err != nil && tc.wantErr == nil) {
				t.Fatalf("the second try: %v, want %v", err, tc.wantErr)
			}
			var sent int64
			if err := pool.QueryRow(ctx, `SELECT sent FROM `+table.Side("replay")+` WHERE id = @run_id`, pgx.NamedArgs{"run_id": run.ID}).Scan(&sent); err != nil {
				t.Fatal(err)
			}
			if want := int64(20 + 10*min(tc.other, 1)); sent != want {
				t.Errorf("%d sent, want %d: counted twice or not at all", sent, want)
			}
		})
	}
}

// The position is written on the session that holds the replay lock. When
// that session goes (Postgres restarted, the connection dropped), the run
// takes the lock again before it writes, and stops if another replay has it
// by now: it never records, nor takes a record for its own, without the lock.
func TestRecordAfterTheLockWentWithItsSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	for _, tc := range []struct {
		name     string
		applied  bool   // the run's write landed before its session went
		other    bool   // another replay took the lock meanwhile
		otherAt  uint64 // ...and moved the record here (0: not)
		wantErr  error
		wantPos  int64
		wantSent int64
	}{
		{"recorded, its answer lost", true, false, 0, nil, 20, 20},
		{"not recorded", false, false, 0, nil, 20, 20},
		{"another replay holds the lock", false, true, 0, ErrLockLost, 0, 0},
		{"another replay recorded the same position", false, true, 20, ErrLockLost, 20, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := lockRecords(t, pool, table)
			run := freshRun(t, table, rec)
			if ok, err := rec.lock.take(ctx); err != nil || !ok {
				t.Fatalf("take the lock: %v, %v", ok, err)
			}
			if tc.applied {
				if err := rec.advance(ctx, run.ID, 0, 20, Counts{Sent: 20}, false, false); err != nil {
					t.Fatal(err)
				}
			}
			// The session goes, and the lock with it.
			var gone bool
			if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend(@pid, 10000)`, pgx.NamedArgs{"pid": rec.lock.conn.Conn().PgConn().PID()}).Scan(&gone); err != nil || !gone {
				t.Fatalf("terminate the lock's session: %v, %v", gone, err)
			}
			if tc.other {
				other := lockRecords(t, pool, table)
				if ok, err := other.lock.take(ctx); err != nil || !ok {
					t.Fatalf("another replay takes the lock: %v, %v", ok, err)
				}
				if tc.otherAt > 0 {
					if err := other.advance(ctx, run.ID, 0, tc.otherAt, Counts{Sent: int64(tc.otherAt)}, false, false); err != nil {
						t.Fatal(err)
					}
				}
			}

			r := &runner{cfg: Config{DB: pool, Table: table}, log: slog.New(slog.DiscardHandler), rec: rec, run: run}
			err := r.record(0, 20, Counts{Sent: 20}, false)
			if !errors.Is(err, tc.wantErr) || (err != nil && tc.wantErr == nil) {
				t.Fatalf("record: %v, want %v", err, tc.wantErr)
			}
			var pos, sent int64
			if err := pool.QueryRow(ctx, `SELECT position, sent FROM `+table.Side("replay")+` WHERE id = @run_id`, pgx.NamedArgs{"run_id": run.ID}).Scan(&pos, &sent); err != nil {
				t.Fatal(err)
			}
			if pos != tc.wantPos || sent != tc.wantSent {
				t.Errorf("record at %d, %d sent; want %d, %d", pos, sent, tc.wantPos, tc.wantSent)
			}
			if tc.wantErr == nil && rec.lock.lost() {
				t.Error("the run goes on without the lock")
			}
		})
	}
}

// A run whose record another replay moved stops reading at its next batch,
// with ErrAdvanced, and records nothing more.
func TestSettleStopsWhenAnotherReplayAdvanced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table, rec := testRecords(t)
	run, err := rec.start(ctx, Record{Stream: "S", Exchange: "X", Request: "from-seq=1", FromSeq: 1, ToSeq: 9})
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.advance(ctx, run.ID, 0, 6, Counts{Sent: 6}, false, false); err != nil { // the other replay
		t.Fatal(err)
	}
	r := &runner{cfg: Config{DB: pool, Table: table}, log: slog.New(slog.DiscardHandler), rec: rec, run: run}
	b := &batch{done: make(chan struct{})}
	for s := uint64(1); s <= 3; s++ {
		b.items = append(b.items, item{seq: s, msg: &relay.Message{MessageID: "m"}})
	}
	close(b.done)
	sent, sem := make(chan *batch, 1), make(chan struct{}, 1)
	sem <- struct{}{}
	sent <- b
	close(sent)
	stopped := false
	res := r.settle(ctx, sent, sem, func() { stopped = true })
	if !errors.Is(res.err, ErrAdvanced) || !res.stopped || !stopped {
		t.Fatalf("settle: %v, stopped %v, reading stopped %v; want ErrAdvanced, both stopped", res.err, res.stopped, stopped)
	}
	var pos int64
	if err := pool.QueryRow(ctx, `SELECT position FROM `+table.Side("replay")).Scan(&pos); err != nil || pos != 6 {
		t.Errorf("record at %d (%v), want the other replay's 6", pos, err)
	}
}

// testRecords is the replay records of a migrated outbox of the test's own.
func testRecords(t *testing.T) (*pgxpool.Pool, schema.Table, records) {
	t.Helper()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	return pool, table, lockRecords(t, pool, table)
}

// lockRecords is newRecords whose lock, once a write took it, is let go
// when the test ends, before its pool closes.
func lockRecords(t *testing.T, pool *pgxpool.Pool, table schema.Table) records {
	t.Helper()
	rec := newRecords(pool, table)
	t.Cleanup(rec.lock.release)
	return rec
}

// freshRun deletes table's runs and starts one of sequences 1..100.
func freshRun(t *testing.T, table schema.Table, rec records) Record {
	t.Helper()
	ctx := context.Background()
	if _, err := rec.db.Exec(ctx, `DELETE FROM `+table.Side("replay")); err != nil {
		t.Fatal(err)
	}
	run, err := rec.start(ctx, Record{Stream: "S", Exchange: "X", Request: "from-seq=1", FromSeq: 1, ToSeq: 100})
	if err != nil {
		t.Fatal(err)
	}
	return run
}
