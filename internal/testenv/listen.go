package testenv

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Listener LISTENs on one channel on a connection of its own and keeps the
// channel of every notification that arrives.
type Listener struct {
	conn *pgx.Conn
	mu   sync.Mutex
	got  []string
}

// Listen connects to url and LISTENs on channel until the test ends.
func Listen(t testing.TB, url, channel string) *Listener {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	l := &Listener{}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		l.mu.Lock()
		l.got = append(l.got, n.Channel)
		l.mu.Unlock()
	}
	if l.conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.conn.Close(context.Background()) })
	l.Exec(t, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	return l
}

// Exec runs sql on the listening connection (to take a lock there, say).
func (l *Listener) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := l.conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// Received is the channels of the notifications arrived so far, after a
// round trip: Postgres delivers those committed already before it answers.
func (l *Listener) Received(t testing.TB) []string {
	t.Helper()
	l.Exec(t, "SELECT 1")
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}
