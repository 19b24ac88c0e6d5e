package metrics

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relayd/relayd/relay"
)

func TestOutboxGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	o := NewOutbox(reg)
	// Before the first read: no made-up zeros, but the stats timestamp, at
	// the start — so that stats that never read are stale, not absent.
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 1 {
		t.Fatalf("before the first read: %d samples, %v; want the stats timestamp alone", n, err)
	}
	if at := testutil.ToFloat64(o); at < float64(time.Now().Add(-time.Minute).Unix()) || at > float64(time.Now().Unix()+1) {
		t.Fatalf("before the first read: stats timestamp %v, want the start", at)
	}
	o.Set([]relay.TargetStats{
		{Target: relay.TargetAMQP},
		{Target: relay.TargetNATS, Pending: 42, Lag: 90 * time.Second, Parked: 3, Retrying: 2},
	})
	want := `
# HELP relayd_outbox_pending_messages Rows not yet delivered to the target (exact up to 10000, then an upper-bound estimate from the id range).
# TYPE relayd_outbox_pending_messages gauge
relayd_outbox_pending_messages{target="amqp"} 0
relayd_outbox_pending_messages{target="nats"} 42
# HELP relayd_parked_messages Rows parked for the target: not retried without an operator.
# TYPE relayd_parked_messages gauge
relayd_parked_messages{target="amqp"} 0
relayd_parked_messages{target="nats"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "relayd_outbox_pending_messages", "relayd_parked_messages"); err != nil {
		t.Fatal(err)
	}
	lag := func() (amqp, nats float64) {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "relayd_outbox_lag_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == "amqp" {
					amqp = m.GetGauge().GetValue()
				} else {
					nats = m.GetGauge().GetValue()
				}
			}
		}
		return
	}
	a1, n1 := lag()
	if a1 != 0 || n1 < 90 {
		t.Fatalf("lag amqp %v nats %v: want 0 and >= 90", a1, n1)
	}
	// Between reads the lag keeps growing with the clock; amqp stays 0.
	testutilEventually(t, func() bool { a2, n2 := lag(); return a2 == 0 && n2 > n1 })
}

func testutilEventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A scrape costs no query: however large the backlog, it answers from the
// last read. Budget: 50 ms (measured: about a millisecond).
func TestScrapeIsCheap(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewRelay(reg, "test")
	o := NewOutbox(reg)
	o.Set([]relay.TargetStats{{Target: relay.TargetAMQP, Pending: 10_000_000, Lag: time.Hour}, {Target: relay.TargetNATS, Pending: 10_000_000, Lag: time.Hour}})
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	best := time.Hour
	for range 10 {
		start := time.Now()
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		best = min(best, time.Since(start))
	}
	t.Logf("scrape: %v (best of 10)", best)
	if best > 50*time.Millisecond {
		t.Fatalf("scrape took %v, want < 50ms", best)
	}
}

func TestReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{relay.Permanent("x"), "permanent"},
		{relay.Unavailable(errTest("down")), "unavailable"},
		{relay.OutOfRoom(errTest("maximum messages exceeded")), "full"},
		{relay.ErrNacked, "nacked"},
		{fmt.Errorf("%w: no queue", relay.ErrReturned), "returned"},
		{errTest("whatever"), "rejected"},
	} {
		if got := Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }
