package metrics

import (
	"maps"
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

// The phase gauges say which phase the relay runs, the table's, and
// whether the two differ.
func TestPhaseGauges(t *testing.T) {
	amqp, dual, nats := []relay.Target{relay.TargetAMQP}, relay.Targets, []relay.Target{relay.TargetNATS}
	for _, tc := range []struct {
		name             string
		s                relay.PhaseState
		running, table   string // "" for none
		mismatch, pinned float64
	}{
		{"no table phase", relay.PhaseState{Running: dual}, "dual", "", 0, 0},
		{"following", relay.PhaseState{Running: nats, Table: nats}, "nats", "nats", 0, 0},
		{"pinned behind", relay.PhaseState{Running: amqp, Table: dual, Pinned: true}, "amqp", "dual", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewRelay(prometheus.NewRegistry(), "test")
			m.Phase(tc.s)
			for _, p := range []string{"amqp", "dual", "nats"} {
				if got, want := testutil.ToFloat64(m.phase.WithLabelValues(p)), b2f(p == tc.running); got != want {
					t.Errorf("relayd_phase{phase=%q} = %v, want %v", p, got, want)
				}
				if got, want := testutil.ToFloat64(m.tablePhase.WithLabelValues(p)), b2f(p == tc.table); got != want {
					t.Errorf("relayd_table_phase{phase=%q} = %v, want %v", p, got, want)
				}
			}
			if got := testutil.ToFloat64(m.mismatch); got != tc.mismatch {
				t.Errorf("relayd_phase_mismatch = %v, want %v", got, tc.mismatch)
			}
			if got := testutil.ToFloat64(m.pinned); got != tc.pinned {
				t.Errorf("relayd_phase_pinned = %v, want %v", got, tc.pinned)
			}
		})
	}
}

// relayd_target_paused says what the relay's Paused says at the scrape,
// per target; 0 before WatchPaused.
func TestTargetPaused(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewRelay(reg, "test")
	var paused []relay.Target
	for _, tc := range []struct {
		name   string
		watch  bool
		paused []relay.Target
		want   map[string]float64
	}{
		{"before WatchPaused", false, nil, map[string]float64{"amqp": 0, "nats": 0}},
		{"nothing paused", true, nil, map[string]float64{"amqp": 0, "nats": 0}},
		{"nats paused", true, []relay.Target{relay.TargetNATS}, map[string]float64{"amqp": 0, "nats": 1}},
		{"both", true, []relay.Target{relay.TargetAMQP, relay.TargetNATS}, map[string]float64{"amqp": 1, "nats": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.watch {
				m.WatchPaused(func() []relay.Target { return paused })
			}
			paused = tc.paused
			fams, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, f := range fams {
				if f.GetName() == "relayd_target_paused" {
					for _, mt := range f.GetMetric() {
						got[mt.GetLabel()[0].GetValue()] = mt.GetGauge().GetValue()
					}
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("relayd_target_paused = %v, want %v", got, tc.want)
			}
		})
	}
}
