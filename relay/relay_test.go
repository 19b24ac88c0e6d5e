package relay

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check outlives a closed pool briefly.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

func TestDeliversEveryRowOncePerTarget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, n := newFake(TargetAMQP), newFake(TargetNATS)
	ids := f.insert(3000, "orders.created")
	f.start(Config{Sinks: []Sink{a, n}, BatchSize: 100, Workers: 4})
	testenv.Eventually(t, 30*time.Second, func() bool { return f.countDone() == len(ids) }, "rows not all done")
	for _, id := range ids {
		if ga, _ := a.count(id); ga != 1 {
			t.Fatalf("amqp got %s %d times", id, ga)
		}
		if gn, _ := n.count(id); gn != 1 {
			t.Fatalf("nats got %s %d times", id, gn)
		}
	}
}

// Changing RELAY_TARGETS never re-sends: rows finished in the legacy-only
// phase are not replayed to JetStream when dual write starts; rows written
// afterwards go to both.
func TestPhaseChangeDoesNotResend(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a1 := newFake(TargetAMQP)
	old := f.insert(50, "orders.created")
	_, cancel, done := f.start(Config{Sinks: []Sink{a1}})
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(old) }, "legacy phase did not finish")
	cancel()
	<-done

	a2, n2 := newFake(TargetAMQP), newFake(TargetNATS)
	f.start(Config{Sinks: []Sink{a2, n2}})
	fresh := f.insert(50, "orders.created")
	testenv.Eventually(t, 10*time.Second, func() bool { return f.countDone() == len(old)+len(fresh) }, "dual phase did not finish")
	if a2.total() != len(fresh) || n2.total() != len(fresh) {
		t.Fatalf("dual phase published amqp %d, nats %d; want only the %d new rows each", a2.total(), n2.total(), len(fresh))
	}
	for _, id := range old {
		if s := f.state(id); s.natsDelivered {
			t.Fatalf("legacy-phase row %s recorded as delivered to nats", id)
		}
	}
}

// Soft stop: cancelling Run lets the in-flight batch finish and record.
func TestStopFinishesInFlightBatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := newFake(TargetAMQP)
	r, err := New(f.pool, Config{Table: f.table, Sinks: []Sink{a}, Workers: 1, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.hooks = &testHooks{afterPublish: func() {
		once.Do(func() { close(inFlight); <-release })
	}}
	ids := f.insert(10, "orders.created")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	<-inFlight
	cancel()
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	for _, id := range ids {
		if !f.state(id).amqpDelivered {
			t.Fatalf("row %s published but not recorded at stop", id)
		}
	}
}

// A relay runs on no table older than schema.Minimum: Run refuses one a
// migration behind, at once, with schema.Require's error, and relays nothing.
func TestRunRefusesATableBeforeTheMinimum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := schema.Table{Schema: testenv.Name("t"), Name: "outbox"}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{table.Schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{table.Schema}.Sanitize()+` CASCADE`) //nolint:errcheck // best effort
	})
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := schema.NewProvider(db, table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, schema.Minimum()-1); err != nil {
		t.Fatal(err)
	}
	a := newFake(TargetAMQP)
	r, err := New(pool, Config{Table: table, Sinks: []Sink{a}, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		var outdated *schema.OutdatedError
		if !errors.As(err, &outdated) || outdated.Version != schema.Minimum()-1 || outdated.Minimum != schema.Minimum() {
			t.Fatalf("Run on a table at %d: %v, want a schema.OutdatedError", schema.Minimum()-1, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run relays a table older than schema.Minimum")
	}
	if a.total() != 0 {
		t.Fatalf("%d rows published from a table older than schema.Minimum", a.total())
	}
}
