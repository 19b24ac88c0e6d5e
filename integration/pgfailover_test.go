package integration

// A Postgres failover under load: a primary and a synchronous standby of the
// test's own (never the shared server), producers and two relayd processes
// on one multi-host URL with target_session_attrs=read-write; the primary is
// stopped immediately and the standby promoted. Everything whose commit a
// producer saw must reach the stream once and RabbitMQ at least once.

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// failoverOutage is how long no server takes writes: from the primary's
// stop to the standby's promotion.
const failoverOutage = 3 * time.Second

// newEnvDB is newEnv on the Postgres at dbURL instead of the shared one.
func newEnvDB(t *testing.T, dbURL string) *env {
	t.Helper()
	e := &env{t: t, dbURL: dbURL, amqpURL: testenv.AMQPURL(t), natsURL: testenv.NATSURL(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if e.pool, err = pgxpool.New(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	e.table = testenv.Outbox(t, e.pool)
	if e.writer, err = outbox.New(outbox.Config{Table: e.table.String()}); err != nil {
		t.Fatal(err)
	}
	id := testenv.Name("it")
	e.stream, e.prefix, e.exchange, e.queue = strings.ToUpper(id), id+".", id, id+"_q"
	e.connectNATS(e.natsURL)
	e.setupAMQP()
	return e
}

// failoverLoad is producers that keep writing through a failover: a
// transaction that fails is not retried (its outcome is unknown: it may
// have committed), the producer goes on with the next.
type failoverLoad struct {
	e        *env
	stop     chan struct{}
	done     chan struct{}
	promoted atomic.Int64 // UnixNano of the promotion; 0 before
	firstNew atomic.Int64 // UnixNano of the first commit after the promotion

	mu        sync.Mutex
	committed map[string]bool // commits the producer saw
	unknown   int             // rows of transactions whose COMMIT failed
	failures  int             // transactions that failed, at any step
}

func startFailoverLoad(e *env, producers int) *failoverLoad {
	l := &failoverLoad{e: e, stop: make(chan struct{}), done: make(chan struct{}), committed: map[string]bool{}}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() { defer wg.Done(); l.produce(p) }()
	}
	go func() { wg.Wait(); close(l.done) }()
	e.t.Cleanup(l.halt)
	return l
}

func (l *failoverLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

func (l *failoverLoad) produce(p int) {
	for seq := 0; ; seq++ {
		select {
		case <-l.stop:
			return
		default:
		}
		msgs := make([]outbox.Message, 1+seq%5)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: fmt.Sprintf("orders.p%d", p), Payload: fmt.Appendf(nil, `{"p":%d,"tx":%d,"i":%d}`, p, seq, i)}
		}
		ids, atCommit, err := l.commit(msgs)
		l.mu.Lock()
		if err != nil {
			l.failures++
		}
		if err != nil && atCommit {
			l.unknown += len(msgs)
		}
		for _, id := range ids {
			l.committed[id] = true
		}
		l.mu.Unlock()
		if err != nil {
			time.Sleep(20 * time.Millisecond) // a producer's retry pause, not a wait for a result
			continue
		}
		if l.promoted.Load() != 0 {
			l.firstNew.CompareAndSwap(0, time.Now().UnixNano())
		}
		time.Sleep(2 * time.Millisecond) // pacing the load
	}
}

// commit writes msgs in a transaction of their own and returns their ids if
// the commit succeeded; atCommit says the COMMIT itself failed, which leaves
// its outcome unknown.
func (l *failoverLoad) commit(msgs []outbox.Message) (ids []string, atCommit bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := l.e.pool.Begin(ctx)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if ids, err = l.e.writer.Write(ctx, tx, msgs...); err != nil {
		return nil, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, true, err
	}
	return ids, false, nil
}

// seen returns a copy of the commits the producers saw, and the failed ones.
func (l *failoverLoad) seen() (committed map[string]bool, unknown, failures int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.committed), l.unknown, l.failures
}

func (l *failoverLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.committed)
}

// deliveries counts, on conn, the delivery records of the test's table:
// rows delivered to RabbitMQ plus rows delivered to JetStream.
func (e *env) deliveries(ctx context.Context, conn *pgx.Conn) (int, error) {
	var n int
	err := conn.QueryRow(ctx, `SELECT count(amqp_delivered_at) + count(nats_delivered_at) FROM (
		SELECT amqp_delivered_at, nats_delivered_at FROM `+e.table.Owed()+`
		UNION ALL SELECT amqp_delivered_at, nats_delivered_at FROM `+e.table.Delivered()+`) r`).Scan(&n)
	return n, err
}

// TestPostgresFailover: producers and two relayd processes in dual write on
// a primary with a synchronous standby; the primary is stopped immediately
// (pg_ctl stop -m immediate) and the standby promoted. The producers and
// relays find the new primary through the multi-host URL by themselves;
// every row whose commit a producer saw is in the stream once by
// Nats-Msg-Id and in the queue at least once, and the time from the
// promotion to the first row relayed on the new primary is logged.
func TestPostgresFailover(t *testing.T) {
	t.Parallel() // its own Postgres; the brokers' names are its own
	primary, standby := testenv.NewPGPair(t)
	e := newEnvDB(t, testenv.MultiHostURL(primary, standby))
	relays := []*proc{startFaultRelay(e, "relay-1"), startFaultRelay(e, "relay-2")}

	// The standby, queried directly (hot standby), sees every delivery the
	// primary recorded; the connection lives through the promotion.
	ctx := t.Context()
	watch, err := pgx.Connect(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())

	load := startFailoverLoad(e, 4)
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool {
		n, err := e.deliveries(ctx, watch)
		return err == nil && n >= 2000 && time.Since(start) > time.Second
	}, "relays did not deliver 1,000 rows before the failover")

	primary.Stop("immediate")
	killed := time.Now()
	before := load.count()
	// A relay started while no server takes writes waits, naming every
	// host, and starts once the standby is promoted.
	late := e.startUnready("relay-3", "RELAY_WORKERS=4", "RELAY_BATCH_SIZE=500")
	relays = append(relays, late)
	hosts := fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", primary.Port, standby.Port)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(late.out.String(), "waiting for postgres") && strings.Contains(late.out.String(), hosts)
	}, "relay-3 did not log its wait for postgres naming %s", hosts)

	// No primary for a while, as a failover manager takes to decide.
	time.Sleep(time.Until(killed.Add(failoverOutage))) // the fault's length, not a wait for a result
	// The standby has long replayed what it received (the last record may be
	// torn, so its replay LSN stays below the received one): the count is what
	// the old primary recorded.
	old, err := e.deliveries(ctx, watch)
	if err != nil {
		t.Fatal(err)
	}
	promoting := time.Now()
	load.promoted.Store(promoting.UnixNano())
	standby.Promote()
	promoted := time.Since(promoting)
	var firstRelayed time.Duration
	testenv.Eventually(t, 30*time.Second, func() bool {
		n, err := e.deliveries(ctx, watch)
		if err == nil && n > old {
			firstRelayed = time.Since(promoting)
			return true
		}
		return false
	}, "no row relayed on the new primary")
	testenv.Eventually(t, 30*time.Second, func() bool { return load.firstNew.Load() != 0 }, "producers did not commit on the new primary")
	firstCommit := time.Duration(load.firstNew.Load() - promoting.UnixNano())
	// A second of traffic on the new primary, then stop writing.
	testenv.Eventually(t, 30*time.Second, func() bool {
		return load.count() >= before+2000 && time.Since(promoting) > time.Second
	}, "producers did not commit 2,000 rows on the new primary")
	testenv.Eventually(t, 30*time.Second, func() bool { return strings.Contains(late.out.String(), "relay started") },
		"relay-3 did not start after the promotion")
	load.halt()
	committed, unknown, failures := load.seen()

	e.waitDelivered(60 * time.Second)
	inDB := e.committedIDs()
	lost := 0
	for id := range committed {
		if !inDB[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of the %d rows whose commit the producers saw are not in the promoted standby's outbox", lost, len(committed))
	}
	// The brokers are checked against the table: a commit whose outcome the
	// producer did not learn may have committed, and is then owed too.
	amqpDupes := e.checkExactlyOnce(inDB, true)
	if bound := 2 * inFlightBound; amqpDupes > bound {
		t.Errorf("rabbitmq duplicates %d exceed the rows the two relays had in flight at the crash, %d", amqpDupes, bound)
	}
	// The one-shot commands find the new primary through the same URL.
	for _, args := range [][]string{{"migrate", "status"}, {"status"}} {
		cmd := exec.Command(relaydBin, args...)
		cmd.Env = e.relayEnv()
		dieWithTest(cmd)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("relayd %s after the failover: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, r := range relays {
		if !r.running() {
			t.Errorf("%s exited:\n%s", r.name, r.out.String())
		}
	}
	t.Logf("%d rows committed as the producers saw (%d before the stop), %d in the table (%d failed transactions, %d rows of them failed at COMMIT: outcome unknown); "+
		"lost %d; jetstream duplicates 0; rabbitmq duplicates %d; traffic %v",
		len(committed), before, len(inDB), failures, unknown, lost, amqpDupes, time.Since(start).Round(time.Millisecond))
	for _, r := range relays[:2] {
		if d := recoveredAfter(t, r, promoting); d >= 0 {
			t.Logf("%s: promotion -> its first batch after the failover %v", r.name, d.Round(time.Millisecond))
		} else {
			t.Logf("%s: no batch after the failover within the test", r.name)
		}
	}
	t.Logf("stop -> promote issued %v; pg_ctl promote took %v; promotion -> first row relayed on the new primary %v; "+
		"promotion -> first producer commit %v",
		promoting.Sub(killed).Round(time.Millisecond), promoted.Round(time.Millisecond),
		firstRelayed.Round(time.Millisecond), firstCommit.Round(time.Millisecond))
}

// recoveredAfter is how long after since relay p logged its first batch
// that worked after a failed one; -1: none.
func recoveredAfter(t *testing.T, p *proc, since time.Time) time.Duration {
	t.Helper()
	first := time.Duration(-1)
	for line := range strings.SplitSeq(p.out.String(), "\n") {
		ts, ok := strings.CutPrefix(line, "time=")
		if !ok || !strings.Contains(line, `msg="relay batch recovered"`) {
			continue
		}
		ts, _, _ = strings.Cut(ts, " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil && at.After(since) && (first < 0 || at.Sub(since) < first) {
			first = at.Sub(since)
		}
	}
	return first
}

// TestPostgresAsyncFailoverLosesUnshipped shows what an asynchronous standby
// means: the replication is cut off (a proxy of the test's own drops the WAL
// stream), the primary commits on without the standby, then stops
// immediately and the standby is promoted. The rows committed meanwhile are
// gone from the database itself, so the relay cannot deliver them; some of
// them it had already published from the old primary. Everything the
// promoted standby has is still delivered: once in the stream, at least
// once to RabbitMQ.
func TestPostgresAsyncFailoverLosesUnshipped(t *testing.T) {
	t.Parallel()
	var repl *faultProxy
	primary, standby := testenv.NewPGPairAsync(t, func(addr string) string {
		repl = newFaultProxy(t, "replication", addr)
		return repl.proxy.Listen
	})
	e := newEnvDB(t, testenv.MultiHostURL(primary, standby))
	relays := []*proc{startFaultRelay(e, "relay-1"), startFaultRelay(e, "relay-2")}
	load := startFailoverLoad(e, 4)
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, a, n := e.counts()
		return a+n >= 2000 && time.Since(start) > time.Second
	}, "relays did not deliver 1,000 rows before the cut")

	repl.inject("timeout", map[string]any{"timeout": 0}, "upstream", "downstream")
	shippedBefore, _, _ := load.seen()
	_, a0, n0 := e.counts()
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, a, n := e.counts()
		return load.count() >= len(shippedBefore)+1000 && a+n >= a0+n0+1000
	}, "the primary did not commit and relay 1,000 rows past the cut")
	primary.Stop("immediate")
	standby.Promote()
	promoted := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool {
		return load.count() >= len(shippedBefore)+2000 && time.Since(promoted) > time.Second
	}, "producers did not commit on the new primary")
	load.halt()
	committed, unknown, _ := load.seen()
	e.waitDelivered(60 * time.Second)

	inDB := e.committedIDs()
	lost, lostBeforeCut := 0, 0
	for id := range committed {
		if !inDB[id] {
			lost++
			if shippedBefore[id] {
				lostBeforeCut++
			}
		}
	}
	if lost == 0 {
		t.Fatalf("no committed row lost: the primary's commits after the cut reached the standby")
	}
	stream, queue := e.streamIDs(), e.queueIDs(time.Second)
	check := func(broker string, got map[string]int, allowDupes bool) (dupes, phantoms int) {
		missing, phantoms, dupes := tally(inDB, got)
		for id := range got {
			if !inDB[id] {
				if !committed[id] && unknown == 0 {
					t.Errorf("%s: message %s neither in the database nor committed by a producer", broker, id)
				}
			}
		}
		if missing > 0 || (dupes > 0 && !allowDupes) {
			t.Errorf("%s: %d rows in the promoted standby: %d missing, %d duplicates", broker, len(inDB), missing, dupes)
		}
		return dupes, phantoms
	}
	_, streamPhantoms := check("jetstream", stream, false)
	// No bound on RabbitMQ's duplicates here: every delivery the old primary
	// recorded after the cut is lost with it, and those rows go again.
	amqpDupes, amqpPhantoms := check("rabbitmq", queue, true)
	for _, r := range relays {
		if !r.running() {
			t.Errorf("%s exited:\n%s", r.name, r.out.String())
		}
	}
	t.Logf("%d rows committed as the producers saw, %d in the promoted standby: lost %d (%d of them acknowledged before the cut); "+
		"published from the old primary for lost rows: jetstream %d, rabbitmq %d; every row the standby has delivered: jetstream duplicates 0, rabbitmq duplicates %d",
		len(committed), len(inDB), lost, lostBeforeCut, streamPhantoms, amqpPhantoms, amqpDupes)
}
