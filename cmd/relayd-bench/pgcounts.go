package main

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
)

// notifyCounter counts the notifications on a channel: the producers'
// wake-ups, each a commit that took the cluster's notify lock through its
// WAL flush.
type notifyCounter struct {
	n    atomic.Int64
	stop context.CancelFunc
	done chan struct{}
}

// countNotifications listens on channel on a connection of its own until
// close.
func (b *bench) countNotifications(ctx context.Context, channel string) (*notifyCounter, error) {
	conn, err := pgx.Connect(ctx, b.o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, outboxsql.Listen(channel)); err != nil {
		conn.Close(ctx) //nolint:errcheck // failed anyway
		return nil, err
	}
	lctx, stop := context.WithCancel(ctx)
	c := &notifyCounter{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the count is what matters
		for {
			if _, err := conn.WaitForNotification(lctx); err != nil {
				return
			}
			c.n.Add(1)
		}
	}()
	return c, nil
}

func (c *notifyCounter) count() int64 { return c.n.Load() }

func (c *notifyCounter) close() {
	c.stop()
	<-c.done
}

// walFlushes is the cluster's WAL flushes so far (pg_stat_wal.wal_sync):
// what a commit waits for, unless synchronous_commit is off.
func walFlushes(ctx context.Context, pool *pgxpool.Pool) (n int64) {
	pool.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&n) //nolint:errcheck // 0 if it failed: a figure, not the run
	return n
}
