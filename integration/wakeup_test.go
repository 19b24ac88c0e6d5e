package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// wakeLockHolder is the pid of the session holding the table's wake lock
// (a relay waiting for rows), or 0.
func (e *env) wakeLockHolder() int {
	var pid int
	e.pool.QueryRow(context.Background(), outboxsql.WakeLockHolder(e.table.WakeLock())).Scan(&pid) //nolint:errcheck // none: 0
	return pid
}

// notifiedCommits writes n single-row commits and returns how many
// notifications a listener on the table's channel got for them.
func (e *env) notifiedCommits(n int) int {
	e.t.Helper()
	ctx := context.Background()
	l := testenv.Listen(e.t, e.dbURL, e.table.Channel())
	for i := range n {
		if _, err := e.writer.Write(ctx, e.pool, outbox.Message{Topic: "test.wake", Payload: []byte{byte(i)}}); err != nil {
			e.t.Fatal(err)
		}
	}
	return len(l.Received(e.t))
}

// A relay SIGKILLed while it waited for rows leaves nothing that makes
// producers notify: its wake lock went with its session. The rows written
// meanwhile reach both brokers once another relay runs.
func TestKilledWaitingRelayLeavesProducersNoNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startRelay("relay", "RELAY_POLL_INTERVAL=10s")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.wakeLockHolder() != 0 }, "waiting relay holds no wake lock")
	p.kill()
	testenv.Eventually(t, 30*time.Second, func() bool { return e.wakeLockHolder() == 0 }, "wake lock outlived the killed relay's session")
	if got := e.notifiedCommits(20); got != 0 {
		t.Fatalf("%d notifications for 20 commits after the waiting relay was killed, want 0", got)
	}

	e.startRelay("relay 2", "RELAY_POLL_INTERVAL=10s")
	e.waitDelivered(30 * time.Second)
	testenv.Eventually(t, 30*time.Second, func() bool { return e.wakeLockHolder() != 0 }, "new relay holds no wake lock")
	if got := e.notifiedCommits(1); got != 1 {
		t.Fatalf("%d notifications for a commit while a relay waits, want 1", got)
	}
	e.waitDelivered(30 * time.Second)
	e.checkExactlyOnce(e.committedIDs(), false)
}

// 10,000 single-row commits from 32 producers while two relays run: each
// row once in the stream and once in the queue.
func TestManyProducersTwoRelays(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startRelay("relay 1")
	e.startRelay("relay 2")
	const producers, each = 32, 313
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = producers
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				msg := outbox.Message{Topic: "test.many", Payload: fmt.Appendf(nil, "%d-%d", p, i)}
				if _, err := e.writer.Write(ctx, pool, msg); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	committed := e.committedIDs()
	if len(committed) != producers*each {
		t.Fatalf("%d rows committed, want %d", len(committed), producers*each)
	}
	e.waitDelivered(2 * time.Minute)
	e.checkExactlyOnce(committed, false)
}
