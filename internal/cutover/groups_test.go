package cutover_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/testenv"
)

// Groups are checked each by its path, under live traffic on the stream:
// a dual-read consumer that keeps up passes though it is never idle, one
// that does not fails; a rolling-upgrade consumer filtering quiet subjects
// passes while other subjects move, and fails once its own do. One group's
// failure leaves the others' verdicts whole.
func TestGroupsUnderLiveTraffic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	ns := testenv.NewStream(t, "cg")
	p := ns.Prefix

	consumer := func(name, filter string, ackWait time.Duration) jetstream.Consumer {
		t.Helper()
		c, err := ns.Stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, FilterSubject: filter,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// keeps-up settles once caught up: a long AckWait only bounds it on a
	// loaded machine. behind is given its whole AckWait to catch up.
	keeps := consumer("keeps-up", p+"live.>", 30*time.Second)
	consumer("behind", p+"live.>", 2*time.Second)
	ledger := consumer("ledger", p+"ledger.>", 2*time.Second)
	cc, err := keeps.Consume(func(m jetstream.Msg) { m.Ack() })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	lc, err := ledger.Consume(func(m jetstream.Msg) { m.Ack() })
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Stop()

	// Live traffic on the dual-read groups' subjects, for the whole test.
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for trafficCtx.Err() == nil {
			ns.JS.Publish(trafficCtx, p+"live.order", []byte("x")) //nolint:errcheck // traffic
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { stopTraffic(); wg.Wait() })

	amqpURL := testenv.AMQPURL(t)
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue, ledgerQueue := testenv.Queue(t, strings.TrimSuffix(p, ".")+"_dual"), testenv.Queue(t, strings.TrimSuffix(p, ".")+"_ledger")
	// The dual-read group's legacy side still reads its queue: allowed.
	if _, err := ch.Consume(queue, "legacy-side", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	var onSample func() // called at the first sample of the watch
	check := func(groups ...cutover.Group) map[string]cutover.Condition {
		t.Helper()
		for i := range groups {
			groups[i].Stream = ns.Name
		}
		var once sync.Once
		res, err := cutover.Check(ctx, cutover.Config{DB: pool, Table: table, JS: ns.JS, AMQPURL: amqpURL,
			Poll: 100 * time.Millisecond, QuietPeriod: 2 * time.Second, Groups: groups,
			OnSample: func(time.Duration, time.Duration) {
				if onSample != nil {
					once.Do(onSample)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]cutover.Condition{}
		ok := true
		for _, c := range res.Conditions {
			got[c.Group+"/"+c.Name] = c
			ok = ok && c.OK
		}
		if res.OK != ok {
			t.Fatalf("Result.OK %v, but the conditions say %v: %+v", res.OK, ok, res.Conditions)
		}
		return got
	}
	want := func(got map[string]cutover.Condition, key string, ok bool, detail string) {
		t.Helper()
		c, found := got[key]
		if !found || c.OK != ok || !strings.Contains(c.Detail, detail) {
			t.Errorf("%s = %+v (found %v), want OK %v and %q", key, c, found, ok, detail)
		}
	}

	got := check(
		cutover.Group{Consumer: "keeps-up", Queue: queue, Path: cutover.DualRead},
		cutover.Group{Consumer: "behind", Path: cutover.DualRead},
		cutover.Group{Consumer: "ledger", Queue: ledgerQueue, Path: cutover.RollingUpgrade},
		cutover.Group{Consumer: "gone", Path: cutover.DualRead},
		cutover.Group{Consumer: "ledger-typo", Queue: queue + "_typo", Path: cutover.DualRead},
	)
	want(got, "/outbox", true, "pending for nats 0")
	want(got, "keeps-up/jetstream consumer", true, "caught up")
	want(got, "keeps-up/legacy queue", true, "1 consumers (dual read")
	want(got, "behind/jetstream consumer", false, "behind after")
	want(got, "ledger/jetstream consumer", true, "pending 0")
	want(got, "ledger/quiescence", true, "got no message for 2s")
	want(got, "gone/jetstream consumer", false, "consumer gone does not exist")
	want(got, "ledger-typo/legacy queue", false, "does not exist")

	// A dual-read group's queue with a backlog that does not drain: its
	// legacy side is behind, and what waits there may predate dual write.
	backlog := testenv.Queue(t, strings.TrimSuffix(p, ".")+"_backlog")
	for range 3 {
		if err := ch.PublishWithContext(ctx, "", backlog, false, false, amqp.Publishing{Body: []byte("old")}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		q, err := ch.QueueDeclarePassive(backlog, true, false, false, false, nil)
		return err == nil && q.Messages == 3
	}, "the backlog did not reach its queue")
	got = check(cutover.Group{Consumer: "behind", Queue: backlog, Path: cutover.DualRead})
	want(got, "behind/legacy queue", false, "never empty in 2s")

	// The rolling-upgrade group's own subjects move during its quiet
	// interval: not quiet.
	onSample = func() {
		if _, err := ns.JS.Publish(ctx, p+"ledger.entry", []byte("1")); err != nil {
			t.Error(err)
		}
	}
	got = check(cutover.Group{Consumer: "ledger", Queue: ledgerQueue, Path: cutover.RollingUpgrade})
	want(got, "ledger/quiescence", false, "its subjects are not quiet")
	onSample = nil
	// Without its queue the group has moved: no quiet needed, only that its
	// consumer keeps up.
	got = check(cutover.Group{Consumer: "ledger", Path: cutover.RollingUpgrade})
	want(got, "ledger/jetstream consumer", true, "caught up")
	if _, found := got["ledger/quiescence"]; found {
		t.Errorf("a rolling-upgrade group without a queue was watched for quiet: %+v", got)
	}
}

// With AllConsumers, a durable consumer of a group's stream that no group
// names fails the check, naming it, until it is a group or excluded;
// ephemeral consumers (relayd tail's, verify's) do not count.
func TestAllConsumersMustBeNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	ns := testenv.NewStream(t, "cn")
	for _, cc := range []jetstream.ConsumerConfig{
		{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy},
		{Durable: "audit", AckPolicy: jetstream.AckExplicitPolicy},
		{Name: "tail", AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute},
	} {
		if _, err := ns.Stream.CreateOrUpdateConsumer(ctx, cc); err != nil {
			t.Fatal(err)
		}
	}
	named := func(exclude ...string) cutover.Condition {
		t.Helper()
		res, err := cutover.Check(ctx, cutover.Config{DB: pool, Table: table, JS: ns.JS, Poll: 50 * time.Millisecond,
			AllConsumers: true, Exclude: exclude, Groups: []cutover.Group{{Stream: ns.Name, Consumer: "billing", Path: cutover.DualRead}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res.Conditions {
			if c.Name == cutover.CondNamed {
				if res.OK != c.OK {
					t.Fatalf("verdict %v with %s %v: %+v", res.OK, c.Name, c.OK, res.Conditions)
				}
				return c
			}
		}
		t.Fatalf("no %s condition: %+v", cutover.CondNamed, res.Conditions)
		return cutover.Condition{}
	}
	if c := named(); c.OK || !strings.Contains(c.Detail, ns.Name+"/audit") || strings.Contains(c.Detail, "tail") {
		t.Errorf("audit unnamed: %+v; want a failure naming %s/audit only", c, ns.Name)
	}
	if c := named("audit"); !c.OK || !strings.Contains(c.Detail, "excluded: audit") {
		t.Errorf("audit excluded: %+v; want it to hold", c)
	}
}
