package cutover_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/cutover"
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

	consumer := func(name, filter string) jetstream.Consumer {
		t.Helper()
		c, err := ns.Stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, FilterSubject: filter,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	keeps := consumer("keeps-up", p+"live.>")
	consumer("behind", p+"live.>")
	ledger := consumer("ledger", p+"ledger.>")
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
	queue, ledgerQueue := testQueue(t, strings.TrimSuffix(p, ".")+"_dual"), testQueue(t, strings.TrimSuffix(p, ".")+"_ledger")
	// The dual-read group's legacy side still reads its queue: allowed.
	if _, err := ch.Consume(queue, "legacy-side", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	check := func(groups ...cutover.Group) map[string]cutover.Condition {
		t.Helper()
		for i := range groups {
			groups[i].Stream = ns.Name
		}
		res, err := cutover.Check(ctx, cutover.Config{DB: pool, Table: table, JS: ns.JS, AMQPURL: amqpURL,
			Poll: 100 * time.Millisecond, QuietPeriod: 2 * time.Second, Groups: groups})
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

	// The rolling-upgrade group's own subjects move: not quiet.
	go func() {
		time.Sleep(500 * time.Millisecond)
		ns.JS.Publish(context.Background(), p+"ledger.entry", []byte("1")) //nolint:errcheck // checked below
	}()
	got = check(cutover.Group{Consumer: "ledger", Queue: ledgerQueue, Path: cutover.RollingUpgrade})
	want(got, "ledger/quiescence", false, "its subjects are not quiet")
	// Without its queue the group has moved: no quiet needed, only that its
	// consumer keeps up.
	got = check(cutover.Group{Consumer: "ledger", Path: cutover.RollingUpgrade})
	want(got, "ledger/jetstream consumer", true, "caught up")
	if _, found := got["ledger/quiescence"]; found {
		t.Errorf("a rolling-upgrade group without a queue was watched for quiet: %+v", got)
	}
}

// testQueue declares a durable queue that the test deletes at its end.
func testQueue(t *testing.T, name string) string {
	t.Helper()
	url := testenv.AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(url); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(name, false, false, false) //nolint:errcheck // cleanup
			}
			c.Close()
		}
	})
	return name
}
