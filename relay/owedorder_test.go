package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
)

// claimAndRecord runs one claim of phase enabled from cf, with active the
// targets the relay can publish to now, and records every RabbitMQ publish
// as amqpOut and every JetStream one delivered: a worker's batch whose
// JetStream publishes succeed.
func claimAndRecord(t *testing.T, f *fixture, st *store, cf *claimFloor, enabled, active phase, amqpOut outboxsql.Outcome) []*claimed {
	t.Helper()
	ctx := context.Background()
	fl := cf.begin(time.Now(), enabled)
	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		cf.end(fl, false)
		t.Fatal(err)
	}
	defer conn.Release()
	rows, snap, err := st.claim(ctx, conn, enabled, active, cf.batchSize, false, fl, nil)
	if err != nil {
		cf.end(fl, false)
		t.Fatal(err)
	}
	cf.claimed(rows, fl, snap, time.Millisecond)
	cf.end(fl, true)
	rec := newBatchRecord(len(rows), enabled)
	for _, c := range rows {
		out := perTarget[outboxsql.Outcome]{AMQP: outcomeNone, NATS: outcomeNone}
		if c.want.AMQP {
			out.AMQP = amqpOut
		}
		if c.want.NATS {
			out.NATS = outcomeDelivered
		}
		rec.add(c, out, perTarget[string]{AMQP: "e", NATS: "e"}, perTarget[time.Duration]{AMQP: time.Hour, NATS: time.Hour})
	}
	if err := st.record(ctx, conn, rec); err != nil {
		t.Fatal(err)
	}
	return rows
}

// insertRow commits one outbox row of key (nil: unkeyed) through q.
func insertRow(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, f *fixture, key any) int64 {
	t.Helper()
	var id int64
	if err := q.QueryRow(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, payload, key) VALUES ('orders.created', '\x00', $1) RETURNING id`,
		key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// Relay R1's floors pass row A of key k while A's transaction runs. A
// commits; relay R2, RabbitMQ down there, takes A for JetStream and moves
// it to the owed table, then B of key k, written after A's commit. R1's next
// claim is the first to see A's transaction ended: A, not B, is key k's
// head for RabbitMQ, though the owed keyed floor stood past it.
func TestOwedKeyedHeadIsARowAnEndedTransactionLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setupOwnDatabase(t)
	st := newStore(f.table)
	natsOnly := phase{perTarget[bool]{NATS: true}}
	r1, r2 := newClaimFloor(10, time.Hour), newClaimFloor(10, time.Hour)

	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	a := insertRow(t, tx, f, "k")
	insertRow(t, f.pool, f, "x") // committed: the keyed floors rise past A
	claimWith(t, f.pool, st, r1, r1.begin(time.Now(), dualWrite), dualWrite, dualWrite, 10)
	if r1.keyed.owed < a {
		t.Fatalf("the owed keyed floor %d did not pass row %d: the test tests nothing", r1.keyed.owed, a)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	claimAndRecord(t, f, st, r2, dualWrite, natsOnly, outcomeNone)
	b := insertRow(t, f.pool, f, "k")
	claimAndRecord(t, f, st, r2, dualWrite, natsOnly, outcomeNone)

	headFirst(t, claimWith(t, f.pool, st, r1, r1.begin(time.Now(), dualWrite), dualWrite, dualWrite, 10), TargetAMQP, a, b)
}

// Dual write with JetStream down: A of key k reaches RabbitMQ and stays
// owed to JetStream. The phase goes to amqp, whose claims count only
// RabbitMQ's rows: the owed floors pass A. B of key k, RabbitMQ to retry in
// an hour, moves to the owed table. Back in dual write, the first claim
// walks the owed table from its oldest row itself (the walk as a sweep would
// run beside it, the last one slow): A, not B, goes to JetStream.
func TestAPhaseEnablingATargetAgainWalksTheOwedTableFromItsOldestRow(t *testing.T) {
	t.Parallel()
	f := setupOwnDatabase(t)
	st := newStore(f.table)
	amqpOnly := phase{perTarget[bool]{AMQP: true}}
	cf := newClaimFloor(10, time.Hour)
	a := insertRow(t, f.pool, f, "k")
	claimAndRecord(t, f, st, cf, dualWrite, amqpOnly, outcomeDelivered)
	b := insertRow(t, f.pool, f, "k")
	claimAndRecord(t, f, st, cf, amqpOnly, amqpOnly, outcomeRetry)
	for i := 0; cf.keyed.owed < a; i++ {
		if i == 50 {
			t.Fatalf("the owed keyed floor %d never passed row %d: the test tests nothing", cf.keyed.owed, a)
		}
		insertRow(t, f.pool, f, nil)
		claimAndRecord(t, f, st, cf, amqpOnly, amqpOnly, outcomeDelivered)
	}
	cf.mu.Lock()
	cf.oldestWalkTook = time.Second
	cf.mu.Unlock()

	headFirst(t, claimWith(t, f.pool, st, cf, cf.begin(time.Now(), dualWrite), dualWrite, dualWrite, 10), TargetNATS, a, b)
}

// headFirst checks that a claim took row a, its key's head, for target, and
// not row b, a later row of the key.
func headFirst(t *testing.T, rows []*claimed, target Target, a, b int64) {
	t.Helper()
	var tookA bool
	for _, c := range rows {
		tookA = tookA || (c.msg.ID == a && c.want.Get(target))
		if c.msg.ID == b && c.want.Get(target) {
			t.Fatalf("row %d of key k claimed for %s while row %d of the key is owed to it", b, target, a)
		}
	}
	if !tookA {
		t.Errorf("row %d, key k's head for %s, not claimed", a, target)
	}
}
