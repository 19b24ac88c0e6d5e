package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/relay"
)

// Outbox exports the backlog of each target — the relay lag gauge on-call
// watches — from stats read on an interval, never at scrape time: a scrape
// costs no query however large the backlog. Between reads the lag gauge
// keeps growing with the clock, so a stalled reader cannot make a stalled
// relay look healthy.
type Outbox struct {
	mu     sync.Mutex // Set writes the fields after it; each scrape's Collect reads them
	stats  []relay.TargetStats
	readAt time.Time // local clock, when stats were read
	start  time.Time // when NewOutbox ran

	lag, pending, parked, held, retrying, statsTime *prometheus.Desc
}

// NewOutbox registers the backlog gauges on reg.
func NewOutbox(reg prometheus.Registerer) *Outbox {
	o := &Outbox{
		lag: prometheus.NewDesc("relayd_outbox_lag_seconds",
			"Age of the oldest row not yet delivered to the target, by the database clock; 0 when nothing is pending.", []string{"target"}, nil),
		pending: prometheus.NewDesc("relayd_outbox_pending_messages",
			"Rows not yet delivered to the target (exact up to 10000, then an upper-bound estimate from the id range).", []string{"target"}, nil),
		parked: prometheus.NewDesc("relayd_parked_messages",
			"Rows parked for the target: not retried without an operator.", []string{"target"}, nil),
		held: prometheus.NewDesc("relayd_outbox_held_keys",
			"Keys with a parked row for the target: their later rows wait for it (unless RELAY_SKIP_PARKED_KEYS).", []string{"target"}, nil),
		retrying: prometheus.NewDesc("relayd_outbox_retrying_messages",
			"Pending rows waiting out a retry backoff after a failed publish (among the oldest 10000).", []string{"target"}, nil),
		statsTime: prometheus.NewDesc("relayd_outbox_stats_timestamp_seconds",
			"Unix time the backlog figures were last read from Postgres; the process's start while they never were.", nil, nil),
		start: time.Now(),
	}
	reg.MustRegister(o)
	return o
}

// Describe implements prometheus.Collector.
func (o *Outbox) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{o.lag, o.pending, o.parked, o.held, o.retrying, o.statsTime} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (o *Outbox) Collect(ch chan<- prometheus.Metric) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.readAt.IsZero() {
		// No figures yet: none is made up, but the time says since when
		// there are none — a relay whose stats never read is stale from
		// its start (RelaydStatsStale), not silent.
		ch <- prometheus.MustNewConstMetric(o.statsTime, prometheus.GaugeValue, float64(o.start.UnixNano())/1e9)
		return
	}
	since := time.Since(o.readAt)
	for _, s := range o.stats {
		t := string(s.Target)
		lag := 0.0
		if s.Pending > 0 {
			lag = (s.Lag + since).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(o.lag, prometheus.GaugeValue, lag, t)
		ch <- prometheus.MustNewConstMetric(o.pending, prometheus.GaugeValue, float64(s.Pending), t)
		ch <- prometheus.MustNewConstMetric(o.parked, prometheus.GaugeValue, float64(s.Parked), t)
		ch <- prometheus.MustNewConstMetric(o.held, prometheus.GaugeValue, float64(s.HeldKeys), t)
		ch <- prometheus.MustNewConstMetric(o.retrying, prometheus.GaugeValue, float64(s.Retrying), t)
	}
	ch <- prometheus.MustNewConstMetric(o.statsTime, prometheus.GaugeValue, float64(o.readAt.UnixNano())/1e9)
}

// Set replaces the figures.
func (o *Outbox) Set(stats []relay.TargetStats) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stats, o.readAt = stats, time.Now()
}

// Run reads stats every interval until ctx is done, at once on start. Read
// errors are logged once per outage; the old figures stay (and the lag
// keeps growing).
func (o *Outbox) Run(ctx context.Context, interval time.Duration, read func(context.Context) ([]relay.TargetStats, error), log *slog.Logger) {
	poll(ctx, interval, read, o.Set, log, "outbox stats")
}

// poll reads every interval until ctx is done, at once on start, and sets
// what it read. Read errors are logged once per outage, as what; the old
// figures stay.
func poll[T any](ctx context.Context, interval time.Duration, read func(context.Context) (T, error), set func(T), log *slog.Logger, what string) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		rctx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		v, err := read(rctx)
		cancel()
		switch {
		case err == nil:
			set(v)
			if failing {
				log.Info(what + " recovered")
			}
			failing = false
		case ctx.Err() == nil && !failing:
			log.Error("read "+what, "error", err.Error())
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
