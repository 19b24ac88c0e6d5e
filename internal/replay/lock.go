package replay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
)

// ErrLockLost: the replay lock went with its connection (Postgres restarted,
// the network dropped it), and another replay took it before this one could
// take it again, so both may have published the same sequences.
var ErrLockLost = errors.New("the replay lock went with its connection and another relayd replay holds it now: stopping")

// session is the connection that holds the one-run replay lock. The run's
// position is written through it, so a write that lands proves that no other
// replay was running.
type session struct {
	db   *pgxpool.Pool
	q    *outboxsql.Statements
	conn *pgxpool.Conn // nil while not held
}

// take takes the lock on a connection of its own; ok is false when another
// replay holds it.
func (l *session) take(ctx context.Context) (ok bool, err error) {
	conn, err := l.db.Acquire(ctx)
	if err != nil {
		return false, err
	}
	if err := conn.QueryRow(ctx, l.q.ReplayLock).Scan(&ok); err != nil || !ok {
		conn.Release()
		return false, err
	}
	l.conn = conn
	return true, nil
}

// lost says the lock is not held: its connection closed, and Postgres let
// the lock go with the session.
func (l *session) lost() bool { return l.conn == nil || l.conn.Conn().IsClosed() }

// retake takes the lock again after its connection was lost; ErrLockLost
// when another replay holds it by now.
func (l *session) retake(ctx context.Context) error {
	if l.conn != nil {
		l.conn.Release()
		l.conn = nil
	}
	ok, err := l.take(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return ErrLockLost
	}
	return nil
}

// release lets the lock go; closing the session does when the unlock fails.
func (l *session) release() {
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, l.q.ReplayUnlock); err != nil {
		l.conn.Conn().Close(ctx) //nolint:errcheck // closing the session releases the lock
	}
	l.conn.Release()
	l.conn = nil
}
