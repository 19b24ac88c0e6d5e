package relay

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// idleState says when this relay waits for rows: no worker has rows in hand
// and some worker can take them. The listener holds the wake lock only then,
// so producers notify only then (docs/design.md, "Waking the relay").
type idleState struct {
	mu sync.Mutex
	n  [3]int // workers in each workerState; each worker moves itself, under mu
	// Workers signal changed when n changes, and as they go to wait after
	// a claim; the listener then looks again.
	changed wakeSignal
	// Workers raise claimedTop to the highest row id a claim of theirs
	// returned; the listener wakes a worker only for rows above it.
	claimedTop atomic.Int64
	// begun numbers the workers' ordinary claims (not sweeps) as they
	// begin; waited is the highest number of those that ended, their
	// workers gone to wait (worker.waiting).
	begun, waited atomic.Int64
}

type workerState int

const (
	workerFree    workerState = iota // claiming, or waiting for a wake-up
	workerBusy                       // claimed rows, until it next waits
	workerStalled                    // waiting for a target or after an error
)

func newIdleState() *idleState { return &idleState{changed: newWakeSignal()} }

func (s *idleState) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[workerBusy] == 0 && s.n[workerFree] > 0
}

func (s *idleState) add(st workerState, d int) {
	s.mu.Lock()
	s.n[st] += d
	s.mu.Unlock()
	s.changed.signal()
}

// claimed notes a claim's rows, which come in id order (store.claim).
func (s *idleState) claimed(rows []*claimed) {
	if len(rows) == 0 {
		return
	}
	raise(&s.claimedTop, rows[len(rows)-1].msg.ID)
}

// raise lifts a to v, if v is higher.
func raise(a *atomic.Int64, v int64) {
	for cur := a.Load(); v > cur && !a.CompareAndSwap(cur, v); cur = a.Load() {
	}
}

// worker is one worker's place in an idleState.
type worker struct {
	s     *idleState
	state workerState
	claim int64 // idleState.begun of its last ordinary claim
}

// claiming numbers an ordinary claim of w's as it begins.
func (w *worker) claiming() { w.claim = w.s.begun.Add(1) }

func (s *idleState) join() *worker {
	s.add(workerFree, 1)
	return &worker{s: s}
}

func (w *worker) set(st workerState) {
	if st == w.state {
		return
	}
	w.s.mu.Lock()
	w.s.n[w.state]--
	w.s.n[st]++
	w.s.mu.Unlock()
	w.state = st
	w.s.changed.signal()
}

// waiting marks w free as it goes to wait for a wake-up: its claim, if it
// was woken for rows, has ended.
func (w *worker) waiting() {
	raise(&w.s.waited, w.claim)
	if w.state == workerFree {
		w.s.changed.signal()
	}
	w.set(workerFree)
}

func (w *worker) leave() { w.s.add(w.state, -1) }

// listenRetry is the listener's backoff between connections. Its cap bounds
// how long after a failover the relay finds the new primary: the listener's
// reconnection wakes the stalled workers (Relay.reconnected).
var listenRetry = backoff.Doubling{Floor: 100 * time.Millisecond, Cap: time.Second, Jitter: 0.5}

// listen LISTENs on the table's channel on a connection of its own and wakes
// a worker on every notification; after an error it reconnects with backoff
// and wakes one once more, as notifications sent meanwhile are lost.
func (r *Relay) listen(ctx context.Context) {
	errs := errlog.New(r.log, "listen")
	wait := time.Duration(0)
	for ctx.Err() == nil {
		listened, err := r.listenOnce(ctx, errs)
		if ctx.Err() != nil {
			return
		}
		errs.Error(err)
		r.wake.signal()
		if listened {
			// A connection that listened and then went (a failover) starts
			// the backoff again, so that reconnections do not wait 10 s.
			wait = 0
		}
		wait = listenRetry.Next(wait)
		backoff.Sleep(ctx, listenRetry.Wait(wait))
	}
}

// listenConnectWait bounds the listener's connect: at least 10 s, and long
// enough for each host of a multi-host URL to get its connect timeout.
func listenConnectWait(cc *pgconn.Config) time.Duration {
	return max(10*time.Second, time.Duration(1+len(cc.Fallbacks))*cc.ConnectTimeout)
}

// listenOnce listens on one connection until it fails, holding the wake
// lock on it while the relay is idle; listened says whether LISTEN took.
func (r *Relay) listenOnce(ctx context.Context, errs *errlog.Limiter) (listened bool, err error) {
	cc := r.pool.Config().ConnConfig.Copy()
	cctx, cancel := context.WithTimeout(ctx, listenConnectWait(&cc.Config))
	conn, err := pgx.ConnectConfig(cctx, cc)
	cancel()
	if err != nil {
		return false, fmt.Errorf("listen: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) // releases the wake lock too
	keys, err := readWakeKeys(ctx, conn, r.cfg.Table)
	if err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	if _, err := conn.Exec(ctx, outboxsql.Listen(keys.channel)); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	errs.OK()
	r.reconnected.signal()   // Postgres may be back: workers stalled after its errors retry now
	r.floor.owedFromOldest() // rows may have been put back in the owed table unannounced
	r.wake.signal()          // and rows arrived while not listening: the claim it wakes takes both
	sql := outboxsql.For(r.cfg.Table)
	lock := wakeLock{conn: conn, key: keys.lock, maxID: sql.MaxID, state: sql.WakeLockState, wokeAt: -1}
	for {
		retry, err := r.syncWakeLock(ctx, &lock)
		if err != nil {
			return true, fmt.Errorf("listen: wake lock: %w", err)
		}
		n, err := r.waitNotification(ctx, conn, retry)
		if err != nil {
			return true, fmt.Errorf("listen: %w", err)
		}
		if n != nil {
			if id := putBackIn(n.Payload); id > 0 {
				r.floor.putBack(id)
			}
			lock.wake(r)
		}
	}
}

// waitNotification waits for a notification (returned), a change of the
// idle state, or retry (when not 0): nil.
func (r *Relay) waitNotification(ctx context.Context, conn *pgx.Conn, retry time.Duration) (*pgconn.Notification, error) {
	wctx, cancel := context.WithCancel(ctx)
	if retry > 0 {
		cancel()
		wctx, cancel = context.WithTimeout(ctx, retry)
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-r.idle.changed:
			cancel()
		case <-wctx.Done():
		}
	}()
	n, err := conn.WaitForNotification(wctx)
	interrupted := err != nil && ctx.Err() == nil && wctx.Err() != nil && !conn.IsClosed()
	cancel()
	<-watched // a change it took is read by the next syncWakeLock
	if interrupted {
		return nil, nil // the state changed, or time to try the lock again
	}
	return n, err
}

// wakeKeys are the channel a producer notifies and the wake lock it tests.
type wakeKeys struct {
	channel string
	lock    int64
}

// rowQuerier is a connection or transaction that runs a query for one row.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// wakeDefault matches created_at's default since 00016, as Postgres prints
// it: the wake lock's key, then the channel passed to <table>_wake.
var wakeDefault = regexp.MustCompile(`^\s*CASE\s+WHEN pg_try_advisory_xact_lock_shared\('?(-?[0-9]+)'?(?:::bigint)?\) THEN now\(\)\s+` +
	`ELSE \S+_wake\('([^']+)'(?:::text)?\)\s+END\s*$`)

// parseWakeDefault reads the keys in created_at's default; ok is false for
// another default.
func parseWakeDefault(dflt string) (keys wakeKeys, ok bool) {
	m := wakeDefault.FindStringSubmatch(dflt)
	if m == nil {
		return wakeKeys{}, false
	}
	lock, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return wakeKeys{}, false
	}
	return wakeKeys{channel: m[2], lock: lock}, true
}

// readWakeKeys reads the channel and wake lock the table's producers use
// from created_at's default (00016; the relay runs on no older table,
// schema.Minimum). They follow the spelling the migration was given
// ("outbox" and "public.outbox" are two channels).
func readWakeKeys(ctx context.Context, db rowQuerier, t schema.Table) (wakeKeys, error) {
	var dflt string
	switch err := db.QueryRow(ctx, outboxsql.WakeDefault, pgx.StrictStructArgs(outboxsql.WakeDefaultParams{Table: t.Ident()})).Scan(&dflt); {
	case errors.Is(err, pgx.ErrNoRows):
		return wakeKeys{}, fmt.Errorf("read the table's wake-up: %s has no created_at default (migration 00016)", t)
	case err != nil:
		return wakeKeys{}, fmt.Errorf("read the table's wake-up: %w", err)
	}
	keys, ok := parseWakeDefault(dflt)
	if !ok {
		return wakeKeys{}, fmt.Errorf("read the table's wake-up: created_at's default in %s is %q, not the wake-up of migration 00016", t, dflt)
	}
	return keys, nil
}

// notify wakes the relays listening on the table's channel when tx
// commits. putBack, when above 0, is the lowest id of the owed table's rows
// tx put back in line or moved there: their owed floors may have passed it.
func notify(ctx context.Context, tx pgx.Tx, t schema.Table, putBack int64) error {
	keys, err := readWakeKeys(ctx, tx, t)
	if err != nil {
		return err
	}
	p := outboxsql.NotifyParams{Channel: keys.channel}
	if putBack > 0 {
		p.Payload = strconv.FormatInt(putBack, 10)
	}
	_, err = tx.Exec(ctx, outboxsql.Notify, pgx.StrictStructArgs(p))
	return err
}

// putBackIn is the id a notification's payload says rows were put back in
// the owed table from (notify), or 0: rows committed in the outbox.
func putBackIn(payload string) int64 {
	id, err := strconv.ParseInt(payload, 10, 64)
	if err != nil || id <= 0 {
		return 0
	}
	return id
}
