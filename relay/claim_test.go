package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/testenv"
)

// Rows of one key reach each broker in id order across 4 workers, even when
// some fail and are retried; a key's failing row holds only that key.
func TestKeyOrderThroughRetries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	var mu sync.Mutex
	failed := map[string]int{}
	flaky := func(m *Message) error {
		mu.Lock()
		defer mu.Unlock()
		// Every 7th row fails twice before it goes through.
		if m.ID%7 == 0 && failed[m.MessageID] < 2 {
			failed[m.MessageID]++
			return errors.New("nats: temporary refusal")
		}
		return nil
	}
	n.setFail(flaky)
	keyOf := f.insertKeyed(20, 30)
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 50, Workers: 4, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond})
	testenv.Eventually(t, 60*time.Second, func() bool { return f.countDone() == len(keyOf) }, "keyed rows not all done")
	checkKeyOrder(t, "amqp", a.confirmedOrder(), keyOf)
	checkKeyOrder(t, "nats", n.confirmedOrder(), keyOf)
}

// A parked row holds the later rows of its key (strict, the default) and no
// other key's; with SkipParkedKeys the later rows go past it.
func TestParkedRowHoldsItsKeyOnly(t *testing.T) {
	t.Parallel()
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprintf("skip=%v", skip), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			a := newFake(TargetAMQP)
			keyOf := f.insertKeyed(3, 5) // k0, k1, k2 x 5 rows
			var poison int64
			for id, k := range keyOf {
				if k == "k1" && (poison == 0 || id < poison) {
					poison = id
				}
			}
			a.setFail(func(m *Message) error {
				if m.ID == poison {
					return Permanent("amqp: refused")
				}
				return nil
			})
			f.start(Config{Sinks: []Sink{a}, SkipParkedKeys: skip})
			want := 10 // k0 and k2
			if skip {
				want = 14 // all but the poison row
			}
			testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == want }, "want %d rows done", want)
			time.Sleep(300 * time.Millisecond) // several poll intervals: held rows must stay held
			if got := f.countDone(); got != want {
				t.Fatalf("%d rows done, want %d", got, want)
			}
			for id, k := range keyOf {
				delivered, _ := a.count(idToMsg(t, f, id))
				switch {
				case id == poison && delivered != 0:
					t.Fatalf("poison row delivered")
				case k == "k1" && id != poison && !skip && delivered != 0:
					t.Fatalf("row %d of the held key delivered past its parked row", id)
				case k != "k1" && delivered != 1:
					t.Fatalf("row %d of an unrelated key delivered %d times", id, delivered)
				}
			}
			checkKeyOrder(t, "amqp", a.confirmedOrder(), keyOf)
			stats, err := ReadStats(context.Background(), f.pool, f.table, []Target{TargetAMQP})
			if err != nil {
				t.Fatal(err)
			}
			if stats[0].HeldKeys != 1 || stats[0].Parked != 1 {
				t.Fatalf("stats %+v: want 1 parked row holding 1 key", stats[0])
			}
		})
	}
}

// A key held by a waiting row (parked, or its retry not due) may have far
// more later rows than a claim's keyed window: they must not crowd out the
// other keys behind them.
func TestHeldKeyLongerThanTheWindow(t *testing.T) {
	t.Parallel()
	for _, held := range []string{"parked", "retry"} {
		t.Run(held, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			a := newFake(TargetAMQP)
			const batch = 10 // window: keyWindow × 10 keyed rows
			hot := f.insertKeyed(1, 3*keyWindow*batch)
			var first int64
			for id := range hot {
				if first == 0 || id < first {
					first = id
				}
			}
			others := f.insertKeyed(5, 10) // keys k0..k4 again: k0 is the hot key
			for id, k := range others {
				if k == "k0" {
					hot[id] = k
					delete(others, id)
				}
			}
			a.setFail(func(m *Message) error {
				if m.ID != first {
					return nil
				}
				if held == "parked" {
					return Permanent("amqp: refused")
				}
				return errors.New("amqp: try later")
			})
			f.start(Config{Sinks: []Sink{a}, BatchSize: batch, Workers: 2, RetryMin: time.Hour, RetryMax: time.Hour})
			testenv.Eventually(t, 20*time.Second, func() bool { return f.countDone() == len(others) },
				"the %d rows of other keys not all done (%d)", len(others), f.countDone())
			time.Sleep(300 * time.Millisecond)
			if got := f.countDone(); got != len(others) {
				t.Fatalf("%d rows done, want %d: the held key's rows went past its first", got, len(others))
			}
			for id := range others {
				if n, _ := a.count(idToMsg(t, f, id)); n != 1 {
					t.Fatalf("row %d of another key delivered %d times", id, n)
				}
			}
		})
	}
}

// A key whose backlog fills the claim's window — a bulk job's rows of one
// key, ahead of the rest — advances one row per batch round trip; the keys
// after it go meanwhile (found past the window by a skip scan of the keys),
// not once its backlog is down to a window's worth.
func TestHotKeyAheadOfTheWindowDoesNotHoldBackTheOthers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := newFake(TargetAMQP)
	const batch = 10 // window: keyWindow × 10 keyed rows
	hot := f.insertKeyed(1, 3*keyWindow*batch)
	others := f.insertKeyed(6, 1) // k0..k5: k0 is the hot key
	for id, k := range others {
		if k == "k0" {
			hot[id] = k
			delete(others, id)
		}
	}
	a.setFail(func(m *Message) error {
		if m.Key == "k0" {
			time.Sleep(10 * time.Millisecond) // a round trip of the hot key's
		}
		return nil
	})
	f.start(Config{Sinks: []Sink{a}, BatchSize: batch, Workers: 2})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(hot)+len(others) }, "not all rows done")
	order := a.confirmedOrder()
	hotBefore, left := 0, len(others)
	for _, id := range order {
		if left == 0 {
			break
		}
		if _, ok := others[id]; ok {
			left--
		} else {
			hotBefore++
		}
	}
	if hotBefore > keyWindow*batch {
		t.Fatalf("the other keys' %d rows went after %d of the hot key's %d: held back until its backlog fit the window (%d rows)",
			len(others), hotBefore, len(hot), keyWindow*batch)
	}
	checkKeyOrder(t, "hot key", order, hot)
	t.Logf("the other keys' rows done after %d of the hot key's %d", hotBefore, len(hot))
}

// Per-key order spans the outbox and the owed table: a key's two rows, the
// first as the case leaves it, the second fresh in the outbox unless the
// case moves it; each claimed row's targets are as wanted.
func TestKeyOrderAcrossTheTwoTables(t *testing.T) {
	t.Parallel()
	const due = `amqp_attempts = 1, amqp_retry_at = now() - interval '1 second', amqp_last_error = 'x', nats_delivered_at = now()`
	for _, tc := range []struct {
		name          string
		first, second string // the rows' state: "" fresh
		skipParked    bool
		want          [2]string // per row, the targets claimed: "" none
	}{
		{"an owed row waits for an earlier row still in the outbox", "", due, false, [2]string{"amqp,nats", ""}},
		{"a fresh row waits for an earlier owed row, per target", due, "", false, [2]string{"amqp", "nats"}},
		{"a fresh row waits for an earlier parked row", "amqp_parked_at = now(), nats_delivered_at = now()", "", false, [2]string{"", "nats"}},
		{"a fresh row goes past an earlier parked row when told", "amqp_parked_at = now(), nats_delivered_at = now()", "", true, [2]string{"", "amqp,nats"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			var ids []int64
			for id := range f.insertKeyed(1, 2) {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			for i, set := range []string{tc.first, tc.second} {
				if set != "" {
					testenv.SetState(t, f.pool, f.table, set, "id = @id", pgx.NamedArgs{"id": ids[i]})
				}
			}
			conn, err := f.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			defer conn.Exec(ctx, `ROLLBACK`) //nolint:errcheck // nothing to keep
			rows, _, err := newStore(f.table).claim(ctx, conn, dualWrite, dualWrite, 500, tc.skipParked, floors{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got [2]string
			for _, c := range rows {
				var to []string
				if c.want.AMQP {
					to = append(to, "amqp")
				}
				if c.want.NATS {
					to = append(to, "nats")
				}
				got[slices.Index(ids, c.msg.ID)] = strings.Join(to, ",")
			}
			if got != tc.want {
				t.Fatalf("claimed %q, want %q", got, tc.want)
			}
		})
	}
}

// An owed keyed row waits for an earlier row of its key still in the
// outbox though the keyed floor passed that row, while its transaction ran:
// the claim's probe starts where that transaction's rows may, once the
// claim's snapshot shows it ended.
func TestOwedKeyedRowWaitsForARowTheKeyedFloorPassed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	var xid, early int64
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload, key) VALUES ('t', '\x00', 'k') RETURNING id`).Scan(&early); err != nil {
		t.Fatal(err)
	}
	var later int64
	if err := f.pool.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload, key) VALUES ('t', '\x00', 'k') RETURNING id`).Scan(&later); err != nil {
		t.Fatal(err)
	}
	// The later row went to JetStream and waits for RabbitMQ's retry; the
	// keyed floor rose past the early row while its transaction ran.
	testenv.SetState(t, f.pool, f.table, `amqp_attempts = 1, amqp_retry_at = now() - interval '1 second', amqp_last_error = 'x', nats_delivered_at = now()`,
		"id = @id", pgx.NamedArgs{"id": later})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Exec(ctx, `ROLLBACK`) //nolint:errcheck // nothing to keep
	fl := floors{fresh: freshWalk{from: later}, keyed: later, freshKeyed: later, pendingXIDs: []int64{xid}, pendingFrom: []int64{early - 1}}
	rows, _, err := newStore(f.table).claim(ctx, conn, dualWrite, dualWrite, 500, false, fl, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rows {
		if c.msg.ID == later {
			t.Fatalf("claimed the later row %d while the early row %d of its key is in the outbox", later, early)
		}
	}
}

// A producer writes a key's rows in order: A commits before B is inserted.
// The keyed floor passed A while A's transaction ran; the claim that first
// sees it ended takes A, not B, though the floor has not gone back yet.
func TestFreshKeyedHeadIsARowTheKeyedFloorPassed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	st, cf := newStore(f.table), newClaimFloor(500, time.Minute)
	claimOnce := func() []*claimed {
		t.Helper()
		fl := cf.begin(time.Now(), dualWrite)
		if fl.beside() {
			cf.end(fl, false)
			t.Fatal("a sweep, not an ordinary claim")
		}
		return claimWith(t, f.pool, st, cf, fl, dualWrite, dualWrite, 500)
	}
	insert := func(db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, key string) (id int64) {
		t.Helper()
		if err := db.QueryRow(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload, key) VALUES ('t', '\x00', $1) RETURNING id`, key).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	claimOnce()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	a := insert(tx, "k")
	insert(f.pool, "j")
	claimOnce() // sees the row of j, not A: the floor rises past A
	if cf.keyed.floor < a {
		t.Fatalf("the keyed floor %d did not pass A %d: the case is not set", cf.keyed.floor, a)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b := insert(f.pool, "k")
	var took []int64
	for _, r := range claimOnce() {
		took = append(took, r.msg.ID)
	}
	if slices.Contains(took, b) || !slices.Contains(took, a) {
		t.Errorf("claimed %v: want A %d, not B %d of the same key, committed after it", took, a, b)
	}
}

// dualWrite is the phase that enables both targets.
var dualWrite = phase{perTarget[bool]{AMQP: true, NATS: true}}
