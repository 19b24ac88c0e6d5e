package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relayd/relayd/relay"
)

// Published counts and times each delivery under its own target.
func TestPublishedPerTarget(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewRelay(reg, "test")
	now := time.Now()
	m.Published(relay.TargetAMQP, now.Add(-2*time.Second))
	m.Published(relay.TargetAMQP, now.Add(-2*time.Second))
	m.Published(relay.TargetNATS, now.Add(-20*time.Millisecond))

	for target, want := range map[relay.Target]float64{relay.TargetAMQP: 2, relay.TargetNATS: 1} {
		if got := testutil.ToFloat64(m.published.WithLabelValues(string(target))); got != want {
			t.Errorf("relayd_published_total{target=%q} = %v, want %v", target, got, want)
		}
	}
	// Latency: both amqp samples above 1 s, the nats one below 0.1 s.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		if mf.GetName() != "relayd_delivery_latency_seconds" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			h := metric.GetHistogram()
			target := metric.GetLabel()[0].GetValue()
			seen++
			switch target {
			case "amqp":
				if h.GetSampleCount() != 2 || h.GetSampleSum() < 4 {
					t.Errorf("amqp latency: %d samples summing to %v s, want 2 summing to about 4 s", h.GetSampleCount(), h.GetSampleSum())
				}
			case "nats":
				if h.GetSampleCount() != 1 || h.GetSampleSum() < 0.02 || h.GetSampleSum() > 1 {
					t.Errorf("nats latency: %d samples summing to %v s, want 1 of about 0.02 s", h.GetSampleCount(), h.GetSampleSum())
				}
			default:
				t.Errorf("latency for unexpected target %q", target)
			}
		}
	}
	if seen != 2 {
		t.Errorf("latency histograms for %d targets, want 2", seen)
	}
}
