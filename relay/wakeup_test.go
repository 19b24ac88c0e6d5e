package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

// wakeLockHolder is the pid of the session holding t's wake lock, or 0.
func wakeLockHolder(t *testing.T, pool *pgxpool.Pool, table schema.Table) int {
	t.Helper()
	ctx := context.Background()
	keys, err := readWakeKeys(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	if keys.lock == 0 {
		t.Fatalf("table %s has no wake lock", table)
	}
	var pid int
	pool.QueryRow(ctx, outboxsql.WakeLockHolder(keys.lock)).Scan(&pid) //nolint:errcheck // none: 0
	return pid
}

// Producers notify only while a relay waits for rows: an idle relay holds the
// wake lock, a busy one does not, and a relay gone leaves nothing behind.
func TestProducersNotifyOnlyWhileARelayWaits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	l := testenv.Listen(t, testenv.DatabaseURL(t), f.table.Channel())
	release := make(chan struct{})
	var once sync.Once
	a := newFake(TargetAMQP)
	a.setFail(func(*Message) error { <-release; return nil })
	_, stop, done := f.start(Config{Sinks: []Sink{a}, Workers: 2, PollInterval: time.Hour})
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the relay's: it waits for the batch

	testenv.Eventually(t, 10*time.Second, func() bool { return wakeLockHolder(t, f.pool, f.table) != 0 }, "idle relay holds no wake lock")
	before := len(l.Received(t))
	f.insert(1, "orders.created") // claimed, and held in the sink
	if got := len(l.Received(t)) - before; got != 1 {
		t.Fatalf("%d notifications for a commit while the relay waited, want 1", got)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return wakeLockHolder(t, f.pool, f.table) == 0 }, "busy relay still holds the wake lock")
	before = len(l.Received(t))
	f.insert(3, "orders.created")
	if got := len(l.Received(t)) - before; got != 0 {
		t.Fatalf("%d notifications for a commit while the relay was busy, want 0", got)
	}

	once.Do(func() { close(release) })
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == 4 }, "rows committed while busy not delivered (poll interval 1h)")
	testenv.Eventually(t, 10*time.Second, func() bool { return wakeLockHolder(t, f.pool, f.table) != 0 }, "relay idle again holds no wake lock")

	stop()
	<-done
	testenv.Eventually(t, 10*time.Second, func() bool { return wakeLockHolder(t, f.pool, f.table) == 0 }, "stopped relay still holds the wake lock")
	before = len(l.Received(t))
	f.insert(1, "orders.created")
	if got := len(l.Received(t)) - before; got != 0 {
		t.Fatalf("%d notifications with no relay running, want 0", got)
	}
}

// A relay that finds rows committed during its last batch claims them
// without taking the wake lock: under load producers do not notify, since
// notifying commits serialise. Each batch's publish commits the next row.
func TestRowsCommittedDuringABatchAreClaimedWithoutTheWakeLock(t *testing.T) {
	t.Parallel()
	const chain = 20
	f := setup(t)
	ctx := context.Background()
	var published, tries, triesInChain atomic.Int64
	sink := newFake(TargetAMQP)
	f.startWith(Config{Sinks: []Sink{sink}, Workers: 1, PollInterval: time.Hour}, func(r *Relay) {
		r.hooks = &testHooks{
			wakeLock: func() { tries.Add(1) },
			afterPublish: func() {
				n := published.Add(1)
				switch {
				case n == 1:
					triesInChain.Store(-tries.Load())
				case n == chain:
					triesInChain.Add(tries.Load())
					return
				}
				if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.created', 'x')`); err != nil {
					t.Errorf("the chain's row %d: %v", n+1, err)
				}
			},
		}
	})
	testenv.Eventually(t, 10*time.Second, func() bool { return wakeLockHolder(t, f.pool, f.table) != 0 }, "idle relay holds no wake lock")
	f.insert(1, "orders.created")
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == chain }, "the chain's rows not all delivered (poll interval 1h)")
	// A claim that returns rows just as the listener looks may still let
	// it try the lock; a relay that tries it after each batch does chain-1.
	if got := triesInChain.Load(); got > 2 {
		t.Errorf("the relay tried the wake lock %d times between %d batches, each with a row committed meanwhile, want at most 2", got, chain)
	}
}

// A row inserted while the relay goes to sleep — after its last claim,
// before it holds the wake lock — notifies no one, and is claimed at once all
// the same: committed before the lock was taken, the relay sees it when it
// takes the lock; still uncommitted, it keeps the relay from taking the lock
// (and so from sleeping) until it commits.
func TestRowCommittedAsTheRelayGoesToSleep(t *testing.T) {
	t.Parallel()
	// Long, so that a row left to the poll cannot pass for one claimed at
	// once on a loaded machine.
	const poll = time.Minute
	for _, tc := range []struct {
		name         string
		commitBefore bool // commit inside the hook, before the lock is tried
	}{
		{"committed before the lock", true},
		{"committed after", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			producer, err := f.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Release()
			var armed atomic.Bool
			var tries atomic.Int64
			var tx pgx.Tx
			hooked := make(chan error, 1)
			f.startWith(Config{Sinks: []Sink{newFake(TargetAMQP)}, Workers: 1, PollInterval: poll}, func(r *Relay) {
				r.hooks = &testHooks{wakeLock: func() {
					tries.Add(1)
					if !armed.CompareAndSwap(true, false) {
						return
					}
					var err error
					if tx, err = producer.Begin(ctx); err == nil {
						_, err = tx.Exec(ctx, `INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.created', 'x')`)
					}
					if err == nil && tc.commitBefore {
						err = tx.Commit(ctx)
					}
					hooked <- err
				}}
			})
			testenv.Eventually(t, 10*time.Second, func() bool { return wakeLockHolder(t, f.pool, f.table) != 0 }, "idle relay holds no wake lock")

			// A row delivered: the relay goes busy, then back to sleep.
			armed.Store(true)
			f.insert(1, "orders.created")
			if err := <-hooked; err != nil {
				t.Fatal(err)
			}
			if !tc.commitBefore {
				after := tries.Load()
				testenv.Eventually(t, 10*time.Second, func() bool { return tries.Load() >= after+3 }, "relay did not try the wake lock again")
				if pid := wakeLockHolder(t, f.pool, f.table); pid != 0 {
					t.Fatalf("relay (pid %d) took the wake lock while an insert was uncommitted", pid)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			testenv.Eventually(t, poll/2, func() bool { return f.countDone() == 2 },
				"row inserted as the relay went to sleep not delivered within half the poll interval: it waits for the poll")
		})
	}
}

// The LISTEN connection dropped again and again over a process's life
// (failovers, idle-session timeouts): each time it had listened, the next
// reconnection comes at once. The backoff used to double across drops and
// never reset: after seven, every reconnection waited 5–10 s, and the
// NOTIFYs of that time were lost.
func TestListenReconnectsAtOnceAfterEachDrop(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.start(Config{Sinks: []Sink{newFake(TargetAMQP)}, PollInterval: time.Hour})
	ctx := context.Background()
	listening := func() int { return wakeLockHolder(t, f.pool, f.table) } // idle: the listener holds it
	for i := range 9 {
		var pid int
		start := time.Now()
		testenv.Eventually(t, 30*time.Second, func() bool { pid = listening(); return pid != 0 }, "no LISTEN connection (drop %d)", i)
		if took := time.Since(start); i > 0 && took > 2*time.Second {
			t.Fatalf("LISTEN back %v after drop %d, want at once (the backoff restarts after a connection that listened)", took, i)
		}
		if _, err := f.pool.Exec(ctx, `SELECT pg_terminate_backend(@pid)`, pgx.NamedArgs{"pid": pid}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return listening() != pid }, "LISTEN connection %d not gone", pid)
	}
	// And a NOTIFY is heard on the last one.
	testenv.Eventually(t, 30*time.Second, func() bool { return listening() != 0 }, "no LISTEN connection at the end")
	f.insert(1, "orders.created")
	testenv.Eventually(t, 5*time.Second, func() bool { return f.countDone() == 1 }, "row not delivered after its NOTIFY (poll interval 1h)")
}

// The wake-up's channel follows the spelling of the table's name migrate was
// given: a table migrated as "name" (on the search_path) and relayed as
// "schema.name" is one table with two channel names. The relay listens on
// the one in created_at's default, so its NOTIFYs are heard (they went unheard, the
// rows waiting for the poll interval).
func TestNotifyHeardWhateverTheSpellingOfTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	sch, name := testenv.Name("t"), testenv.Name("o")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{sch}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{sch}.Sanitize()+` CASCADE`) }) //nolint:errcheck // best effort
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = sch
	onPath, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(onPath)
	_, err = schema.Up(ctx, db, schema.Table{Name: name}, nil)
	db.Close()
	onPath.Close()
	if err != nil {
		t.Fatal(err)
	}

	f := &fixture{t: t, pool: pool, table: schema.Table{Schema: sch, Name: name}}
	f.start(Config{Sinks: []Sink{newFake(TargetAMQP)}, PollInterval: time.Hour})
	testenv.Eventually(t, 30*time.Second, func() bool { return wakeLockHolder(t, pool, f.table) != 0 }, "no idle LISTEN connection")
	f.insert(1, "orders.created")
	testenv.Eventually(t, 5*time.Second, func() bool { return f.countDone() == 1 }, "row not delivered after its NOTIFY (poll interval 1h)")
}

// Each host of a multi-host URL gets its connect timeout before the
// listener's connect gives up.
func TestListenConnectWait(t *testing.T) {
	for _, tc := range []struct {
		hosts   int
		timeout time.Duration
		want    time.Duration
	}{
		{1, 0, 10 * time.Second},
		{1, 3 * time.Second, 10 * time.Second},
		{3, 3 * time.Second, 10 * time.Second},
		{5, 3 * time.Second, 15 * time.Second},
	} {
		cc := &pgconn.Config{ConnectTimeout: tc.timeout, Fallbacks: make([]*pgconn.FallbackConfig, tc.hosts-1)}
		if got := listenConnectWait(cc); got != tc.want {
			t.Errorf("%d hosts of %v: %v, want %v", tc.hosts, tc.timeout, got, tc.want)
		}
	}
}

// The wake-up in created_at's default is read as Postgres prints it; another
// default is not taken for one.
func TestWakeDefaultPattern(t *testing.T) {
	for _, tc := range []struct {
		dflt, channel string
		lock          int64
	}{
		{"\nCASE\n    WHEN pg_try_advisory_xact_lock_shared('8243113960884112866'::bigint) THEN now()\n    ELSE s.outbox_wake('relayd_s_outbox'::text)\nEND",
			"relayd_s_outbox", 8243113960884112866},
		{"CASE WHEN pg_try_advisory_xact_lock_shared('-42'::bigint) THEN now() ELSE outbox_wake('relayd_outbox'::text) END", "relayd_outbox", -42},
		{"now()", "", 0},
		{"CASE WHEN pg_try_advisory_xact_lock_shared('1'::bigint) THEN now() ELSE clock_timestamp() END", "", 0},
		{"CASE WHEN pg_try_advisory_xact_lock_shared('99999999999999999999'::bigint) THEN now() ELSE outbox_wake('c'::text) END", "", 0},
	} {
		got, ok := parseWakeDefault(tc.dflt)
		if want := (wakeKeys{tc.channel, tc.lock}); got != want || ok != (tc.lock != 0) {
			t.Errorf("%q: %+v, %v; want %+v", tc.dflt, got, ok, want)
		}
	}
}

// A notification's payload: empty from producers (rows committed), the
// lowest id put back in the owed table from RetryParked and late confirms.
func TestPutBackIn(t *testing.T) {
	for _, tc := range []struct {
		payload string
		want    int64
	}{
		{"", 0}, {"123", 123}, {"0", 0}, {"-5", 0}, {"x", 0}, {"99999999999999999999", 0},
	} {
		if got := putBackIn(tc.payload); got != tc.want {
			t.Errorf("putBackIn(%q) = %d, want %d", tc.payload, got, tc.want)
		}
	}
}

// holderConn is a connection of f's pool for a test to hold a lock or a
// transaction on until it ends: closing it then ends what it held.
func holderConn(t *testing.T, f *fixture) *pgxpool.Conn {
	t.Helper()
	c, err := f.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Conn().Close(context.Background()) //nolint:errcheck // ends what it held
		c.Release()
	})
	return c
}

// While a producer's long transaction holds the wake lock shared, the idle
// relay cannot take it and producers do not notify: the relay watches for
// their rows, and claims each at once, however long the lock has been held.
// While another relay holds it, producers notify: the relay only listens.
func TestRowsCommittedWhileTheWakeLockIsHeld(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		hold    func(t *testing.T, f *fixture, conn *pgxpool.Conn)
		watches bool
	}{
		{"by a producer's open transaction", func(t *testing.T, f *fixture, conn *pgxpool.Conn) {
			// Its insert took the lock shared: no relay held it.
			if _, err := conn.Exec(context.Background(), `BEGIN; INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.held', 'x')`); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"by another relay", func(t *testing.T, f *fixture, conn *pgxpool.Conn) {
			keys, err := readWakeKeys(context.Background(), f.pool, f.table)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock(@lock_key)`, pgx.NamedArgs{"lock_key": keys.lock}); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setupOwnDatabase(t) // a transaction held for seconds
			tc.hold(t, f, holderConn(t, f))

			var tries, watched atomic.Int64
			sink := newFake(TargetAMQP)
			f.startWith(Config{Sinks: []Sink{sink}, Workers: 1, PollInterval: time.Hour}, func(r *Relay) {
				r.hooks = &testHooks{wakeLock: func() { tries.Add(1) }, watch: func() { watched.Add(1) }}
			})
			// Eight failed tries: the next is 5 s away.
			testenv.Eventually(t, 20*time.Second, func() bool { return tries.Load() >= 8 }, "relay did not try the wake lock 8 times")
			for i := range 3 {
				at := time.Now()
				f.insert(1, "orders.created")
				testenv.Eventually(t, 10*time.Second, func() bool { return sink.total() == i+1 }, "row %d not claimed", i)
				if took := time.Since(at); took > time.Second {
					t.Errorf("row %d claimed %v after its commit, want at once (poll interval 1h)", i, took)
				}
			}
			if got := watched.Load(); (got > 0) != tc.watches {
				t.Errorf("the relay read the top id %d times between tries, want watching %v", got, tc.watches)
			}
		})
	}
}

// While a producer's long transaction holds the wake lock, the relay's
// tries of the lock do not wait for it: a waiting exclusive request would
// make each producer inserting meanwhile notify. Tries come every 40 ms
// (the poll interval caps their backoff), and each waited 20 ms.
func TestProducersDoNotNotifyWhileTheRelayWatches(t *testing.T) {
	t.Parallel()
	const rows = 20
	f := setupOwnDatabase(t) // a transaction held for seconds
	if _, err := holderConn(t, f).Exec(context.Background(), `BEGIN; INSERT INTO `+f.table.Ident()+` (topic, payload) VALUES ('orders.held', 'x')`); err != nil {
		t.Fatal(err)
	}

	l := testenv.Listen(t, f.pool.Config().ConnString(), f.table.Channel())
	var tries, watched atomic.Int64
	sink := newFake(TargetAMQP)
	f.startWith(Config{Sinks: []Sink{sink}, Workers: 1, PollInterval: 40 * time.Millisecond}, func(r *Relay) {
		r.hooks = &testHooks{wakeLock: func() { tries.Add(1) }, watch: func() { watched.Add(1) }}
	})
	testenv.Eventually(t, 10*time.Second, func() bool { return tries.Load() >= 4 && watched.Load() > 0 }, "the relay did not watch after trying the wake lock")
	before := len(l.Received(t))
	for range rows {
		f.insert(1, "orders.created")
	}
	if got := len(l.Received(t)) - before; got != 0 {
		t.Errorf("%d of %d commits notified while the relay watched, want 0", got, rows)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return sink.total() == rows }, "rows not claimed")
}

// While it watches, the listener reads the top id again soon after a read
// that found no row, less soon after each such read: under load a row waits
// about the time between two rows, not wakeLockWait.
func TestWatchWait(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name  string
		woke  []bool // each read's outcome, in order
		until time.Duration
		want  []time.Duration
	}{
		{"quiet", []bool{false, false, false, false, false, false, false}, time.Second,
			[]time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 20 * ms, 20 * ms}},
		{"a row starts it again", []bool{false, false, false, true, false}, time.Second,
			[]time.Duration{1 * ms, 2 * ms, 4 * ms, wakeLockWait, 1 * ms}},
		{"the next try comes first", []bool{false, false, true}, 3 * ms,
			[]time.Duration{1 * ms, 2 * ms, 3 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l wakeLock
			for i, woke := range tc.woke {
				if got := l.watchWait(woke, tc.until); got != tc.want[i] {
					t.Errorf("read %d (woke %v): wait %v, want %v", i, woke, got, tc.want[i])
				}
			}
		})
	}
}
