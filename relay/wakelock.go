package relay

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/outboxsql"
)

// wakeLock is the table's wake lock on the listening connection. Only the
// listener's goroutine reads and writes it.
type wakeLock struct {
	conn  *pgx.Conn
	key   int64
	maxID string // outboxsql's MaxID, for the table
	state string // and its WakeLockState
	held  bool
	retry time.Duration // the wait after the last failed try
	next  time.Time     // when to try again after a failed try
	// watch is set when only producers held the lock at the last try
	// that asked, so no one notifies: the listener reads the top id
	// (watchRetry apart), tries the lock at each read without waiting, and
	// wakes a worker for ids above seen.
	watch bool
	every time.Duration // the wait after the last of those reads
	seen  int64         // the highest id those reads returned
	// wokeAt is idleState.begun when the listener last woke a worker
	// (-1: never).
	wokeAt int64
}

// wakeLockWait is how long a relay waits for the wake lock: for the
// producers between an insert and its commit, who hold it shared. Producers
// that insert meanwhile notify, as the relay is about to wait.
const wakeLockWait = 20 * time.Millisecond

// watchRetry spaces the listener's reads of the top id while it watches:
// from 1 ms, doubling while they find no row, up to wakeLockWait. Under load
// a row waits about the time between two rows, not wakeLockWait.
var watchRetry = backoff.Doubling{Floor: time.Millisecond, Cap: wakeLockWait}

// syncWakeLock takes the wake lock when the relay has become idle with no
// row waiting, and releases it when a worker has rows. It returns how soon
// to try again when the lock was wanted but could not be had (0: no need).
func (r *Relay) syncWakeLock(ctx context.Context, l *wakeLock) (time.Duration, error) {
	want := r.idle.idle()
	if want && !l.held && l.watch {
		return r.watchWakeLock(ctx, l)
	}
	switch {
	case want && !l.held:
		// Under load the rows committed during the last batch are there:
		// wake a worker for them without the lock, which would make
		// producers notify (notifying commits serialise). The worker woken
		// last has yet to claim while no claim begun since has ended.
		if r.idle.waited.Load() <= l.wokeAt {
			return 0, nil
		}
		top, err := l.top(ctx, r)
		if err != nil {
			return 0, err
		}
		if l.wakeFor(r, top) {
			return 0, nil
		}
		r.hooks.onWakeLock()
		top, relayHolds, err := l.take(ctx, r.idle.claimedTop.Load())
		if err != nil {
			return 0, err
		}
		l.wakeFor(r, top)
		if l.held {
			l.retry, l.watch = 0, false
			return 0, nil
		}
		l.every = 0
		if l.missed(relayHolds, r.cfg.PollInterval) {
			return l.watchWait(false, l.retry), nil
		}
		return l.retry, nil
	case !want && l.held:
		if _, err := l.conn.Exec(ctx, outboxsql.WakeUnlock, pgx.StrictStructArgs(outboxsql.WakeLockParams{Key: l.key})); err != nil {
			return 0, err
		}
		l.held, l.retry, l.watch = false, 0, false
	}
	return 0, nil
}

// watchWakeLock reads the top id while only producers hold the wake lock,
// trying the lock at each read without waiting for it: a waiting exclusive
// request would make every producer inserting meanwhile notify, and hold up
// the listener. When a try is due it also asks who holds the lock: another
// relay, which producers notify, is not watched.
func (r *Relay) watchWakeLock(ctx context.Context, l *wakeLock) (time.Duration, error) {
	if r.idle.waited.Load() <= l.wokeAt {
		return 0, nil // the end of the claim it woke brings the next read
	}
	r.hooks.onWatch()
	// Read before the round trip: a wait of 0 would be no timeout at all.
	until := time.Until(l.next)
	due := until <= 0
	if due {
		r.hooks.onWakeLock()
	}
	top, relayHolds, err := l.try(ctx, max(l.seen, r.idle.claimedTop.Load()), due)
	if err != nil {
		return 0, err
	}
	woke := l.wakeFor(r, top)
	if l.held {
		l.retry, l.watch = 0, false
		return 0, nil
	}
	if due {
		if !l.missed(relayHolds, r.cfg.PollInterval) {
			return l.retry, nil
		}
		until = l.retry
	}
	return l.watchWait(woke, until), nil
}

// missed schedules the next try after one that asked who holds the lock
// and did not get it: held by another relay, whose listener producers
// notify, or by producers alone, one of them a long transaction. Tries come
// less and less often, up to poll; it reports whether to watch meanwhile.
func (l *wakeLock) missed(relayHolds bool, poll time.Duration) (watch bool) {
	l.retry = min(max(2*l.retry, wakeLockWait), poll)
	l.next, l.watch = time.Now().Add(l.retry), !relayHolds
	return l.watch
}

// watchWait is how long to wait for the next read of the top id, after
// one that woke a worker or not, until the next try of the lock (> 0).
func (l *wakeLock) watchWait(woke bool, until time.Duration) time.Duration {
	if woke {
		l.every = 0
		return min(wakeLockWait, until)
	}
	l.every = watchRetry.Next(l.every)
	return min(l.every, until)
}

// top reads the outbox's highest id above what this relay's claims
// returned and the lock's reads saw (0: none), without the lock.
func (l *wakeLock) top(ctx context.Context, r *Relay) (top int64, err error) {
	err = l.conn.QueryRow(ctx, l.maxID, pgx.StrictStructArgs(outboxsql.MaxIDParams{Above: max(l.seen, r.idle.claimedTop.Load())})).Scan(&top)
	return top, err
}

// try takes the wake lock if no session holds it, without waiting, and
// returns the table's highest id above (0 if none), read after the try; with
// state, also whether another session holds the lock exclusively, as take.
func (l *wakeLock) try(ctx context.Context, above int64, state bool) (top int64, relayHolds bool, err error) {
	b := &pgx.Batch{}
	b.Queue(outboxsql.WakeTryLock, pgx.StrictStructArgs(outboxsql.WakeLockParams{Key: l.key}))
	if state {
		b.Queue(l.state, l.stateArgs(above))
	} else {
		b.Queue(l.maxID, pgx.StrictStructArgs(outboxsql.MaxIDParams{Above: above}))
	}
	br := l.conn.SendBatch(ctx, b)
	var got bool
	if err = br.QueryRow().Scan(&got); err == nil {
		l.held = got
		if state {
			err = br.QueryRow().Scan(&top, &relayHolds)
		} else {
			err = br.QueryRow().Scan(&top)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return top, relayHolds && !got, err
}

// stateArgs are WakeLockState's arguments for the lock's key (its halves)
// and the rows above above.
func (l *wakeLock) stateArgs(above int64) pgx.QueryRewriter {
	return pgx.StrictStructArgs(outboxsql.WakeLockStateParams{Above: above, LockClass: uint32(uint64(l.key) >> 32), LockObject: uint32(l.key)})
}

// wakeFor wakes a worker when top, the outbox's highest id, is a row no
// claim of this relay returned and the lock's reads had not seen; it
// reports whether it did.
func (l *wakeLock) wakeFor(r *Relay, top int64) bool {
	woke := top > max(l.seen, r.idle.claimedTop.Load())
	if woke {
		l.wake(r) // rows committed since the last claim, unannounced
	}
	l.seen = max(l.seen, top)
	return woke
}

// wake wakes a worker. Every claim numbered past wokeAt begins after
// this: it sees the rows the listener woke it for.
func (l *wakeLock) wake(r *Relay) {
	l.wokeAt = r.idle.begun.Load()
	r.wake.signal()
}

// take waits up to wakeLockWait for the wake lock and returns the table's
// highest id above claimed (0 if none), read after the lock was taken: the
// rows of every producer that held it shared are visible then. When the
// lock could not be had, relayHolds says whether another session holds it
// exclusively: a relay, which producers notify.
func (l *wakeLock) take(ctx context.Context, claimed int64) (top int64, relayHolds bool, err error) {
	b := &pgx.Batch{}
	b.Queue(outboxsql.LockTimeout, pgx.StrictStructArgs(outboxsql.LockTimeoutParams{LockTimeout: strconv.Itoa(int(wakeLockWait.Milliseconds())) + "ms"}))
	b.Queue(outboxsql.WakeLock, pgx.StrictStructArgs(outboxsql.WakeLockParams{Key: l.key}))
	b.Queue(l.maxID, pgx.StrictStructArgs(outboxsql.MaxIDParams{Above: claimed}))
	br := l.conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		if _, err = br.Exec(); err == nil {
			l.held = true
			err = br.QueryRow().Scan(&top)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
		return top, false, err
	}
	// A long producer transaction holds it shared, or another relay holds
	// it: still, rows may have committed.
	err = l.conn.QueryRow(ctx, l.state, l.stateArgs(claimed)).Scan(&top, &relayHolds)
	return top, relayHolds, err
}
