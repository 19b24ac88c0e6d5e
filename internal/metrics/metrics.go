// Package metrics turns what the relay does into Prometheus metrics.
//
// Everything registers on a Registerer the caller gives (never the global
// one), names follow Prometheus conventions, and labels are bounded: target
// is "amqp" or "nats", reason one of a fixed handful.
package metrics

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/relay"
)

// Relay implements relay.Observer with Prometheus metrics.
type Relay struct {
	published    *prometheus.CounterVec
	errors       *prometheus.CounterVec
	parked       *prometheus.CounterVec
	duplicates   prometheus.Counter
	returned     prometheus.Counter
	lateConfirms *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	batch        prometheus.Histogram
	lastProgress prometheus.Gauge
	phase        *prometheus.GaugeVec
	tablePhase   *prometheus.GaugeVec
	mismatch     prometheus.Gauge
	pinned       prometheus.Gauge
	// paused is set once by WatchPaused, read at each scrape.
	paused atomic.Pointer[func() []relay.Target]

	// The per-target children of published and latency, looked up once:
	// Published runs for every row and target, and WithLabelValues hashes
	// the label and takes a lock each time.
	targets map[relay.Target]targetMetrics
}

type targetMetrics struct {
	published prometheus.Counter
	latency   prometheus.Observer
}

var _ relay.Observer = (*Relay)(nil)

// NewRelay registers the relay's metrics, the build info and the Go runtime
// and process collectors on reg.
func NewRelay(reg prometheus.Registerer, version string) *Relay {
	f := func(c prometheus.Collector) prometheus.Collector { reg.MustRegister(c); return c }
	m := &Relay{
		published: f(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_published_total", Help: "Messages confirmed by the broker, per target.",
		}, []string{"target"})).(*prometheus.CounterVec),
		errors: f(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_publish_errors_total", Help: "Failed publishes, per target and reason (unavailable, timeout, full, returned, nacked, rejected, permanent).",
		}, []string{"target", "reason"})).(*prometheus.CounterVec),
		parked: f(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_parked_total", Help: "Rows parked by this process, per target.",
		}, []string{"target"})).(*prometheus.CounterVec),
		duplicates: f(prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relayd_duplicates_total", Help: "JetStream PubAcks that said Duplicate (already stored; counted as delivered).",
		})).(prometheus.Counter),
		lateConfirms: f(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_late_confirms_total", Help: "Confirms that came after their batch gave up waiting, recorded as deliveries, per target.",
		}, []string{"target"})).(*prometheus.CounterVec),
		returned: f(prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relayd_returned_total", Help: "Messages RabbitMQ returned as unroutable (not delivered; retried).",
		})).(prometheus.Counter),
		latency: f(prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "relayd_delivery_latency_seconds", Help: "Row created_at to broker confirm, per target.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"target"})).(*prometheus.HistogramVec),
		batch: f(prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "relayd_batch_duration_seconds", Help: "Claim, publish and record of one batch.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		})).(prometheus.Histogram),
		lastProgress: f(prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relayd_last_progress_timestamp_seconds", Help: "Unix time of the last batch that recorded an outcome.",
		})).(prometheus.Gauge),
		phase: f(prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_phase", Help: "1 for the phase this relay runs (amqp, dual or nats), 0 for the others.",
		}, []string{"phase"})).(*prometheus.GaugeVec),
		pinned: f(prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relayd_phase_pinned", Help: "1 when RELAY_TARGETS pins this relay's phase: it does not follow relayd phase set.",
		})).(prometheus.Gauge),
		tablePhase: f(prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_table_phase", Help: "1 for the phase set on the outbox (relayd phase set), 0 for the others; all 0 while none is set.",
		}, []string{"phase"})).(*prometheus.GaugeVec),
		mismatch: f(prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relayd_phase_mismatch", Help: "1 while this relay runs a phase other than the outbox's (pinned by RELAY_TARGETS, or unable to follow).",
		})).(prometheus.Gauge),
	}
	m.targets = make(map[relay.Target]targetMetrics, len(relay.Targets))
	for _, t := range relay.Targets {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relayd_target_paused", Help: "1 while the relay publishes nothing to the target: its broker connection is down, or every publish of its last batches failed for want of the broker (a missing stream, a sealed one).",
			ConstLabels: prometheus.Labels{"target": string(t)},
		}, func() float64 {
			f := m.paused.Load()
			return b2f(f != nil && slices.Contains((*f)(), t))
		}))
		m.targets[t] = targetMetrics{
			published: m.published.WithLabelValues(string(t)),
			latency:   m.latency.WithLabelValues(string(t)),
		}
		m.lateConfirms.WithLabelValues(string(t)) // 0 from the start, so that increase() sees the first
	}
	bi := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "relayd_build_info", Help: "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": version, "go_version": runtime.Version()},
	})
	bi.Set(1)
	reg.MustRegister(bi, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// WatchPaused has relayd_target_paused read paused (relay.Relay.Paused)
// at each scrape; until then it says 0.
func (m *Relay) WatchPaused(paused func() []relay.Target) { m.paused.Store(&paused) }

// Batch implements relay.Observer.
func (m *Relay) Batch(d time.Duration, _ int) {
	m.batch.Observe(d.Seconds())
	m.lastProgress.SetToCurrentTime()
}

// Published implements relay.Observer.
func (m *Relay) Published(t relay.Target, createdAt time.Time) {
	if tm, ok := m.targets[t]; ok {
		tm.published.Inc()
		tm.latency.Observe(time.Since(createdAt).Seconds())
	}
}

// PublishFailed implements relay.Observer.
func (m *Relay) PublishFailed(t relay.Target, err error) {
	r := Reason(err)
	if r == "returned" {
		m.returned.Inc()
	}
	m.errors.WithLabelValues(string(t), r).Inc()
}

// Parked implements relay.Observer.
func (m *Relay) Parked(t relay.Target) {
	m.parked.WithLabelValues(string(t)).Inc()
	m.errors.WithLabelValues(string(t), "permanent").Inc()
}

// LateConfirmed implements relay.Observer.
func (m *Relay) LateConfirmed(t relay.Target, n int) {
	m.lateConfirms.WithLabelValues(string(t)).Add(float64(n))
}

// Phase implements relay.Observer.
func (m *Relay) Phase(s relay.PhaseState) {
	running := phase.Of(s.Running)
	for _, p := range phase.Names {
		m.phase.WithLabelValues(string(p)).Set(b2f(p == running))
		m.tablePhase.WithLabelValues(string(p)).Set(b2f(s.Table != nil && p == phase.Of(s.Table)))
	}
	m.mismatch.Set(b2f(s.Mismatch()))
	m.pinned.Set(b2f(s.Pinned))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Duplicate counts a PubAck that said Duplicate.
func (m *Relay) Duplicate() { m.duplicates.Inc() }

// Reason maps a publish error to the bounded reason label.
func Reason(err error) string {
	switch {
	case relay.IsPermanent(err):
		return "permanent"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, relay.ErrOutOfRoom):
		return "full"
	case errors.Is(err, relay.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, relay.ErrReturned):
		return "returned"
	case errors.Is(err, relay.ErrNacked):
		return "nacked"
	default:
		return "rejected"
	}
}
