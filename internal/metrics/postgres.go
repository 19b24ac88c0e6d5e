package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/internal/pghealth"
)

// HolderInfoAfter is how long a holder holds the horizon before
// relayd_postgres_horizon_holder_info names it: the short transactions that
// are always the oldest for a moment would make a series each.
const HolderInfoAfter = time.Minute

// Postgres exports what holds back VACUUM's horizon, and the dead rows and
// size of relayd's tables, from figures read on an interval.
type Postgres struct {
	mu     sync.Mutex
	health pghealth.Health
	at     time.Time            // when Set was last called; zero before
	seen   map[string]time.Time // a holder (kind, pid, name, horizon): when first read
	now    func() time.Time

	age, xids, holder, dead, size *prometheus.Desc
}

// NewPostgres registers the gauges on reg.
func NewPostgres(reg prometheus.Registerer) *Postgres {
	p := &Postgres{
		seen: map[string]time.Time{}, now: time.Now,
		age: prometheus.NewDesc("relayd_postgres_horizon_age_seconds",
			"How long the oldest holder of VACUUM's horizon of each kind has run (transaction, snapshot, standby, prepared, replication slot); from when relayd first saw it where Postgres does not say.", []string{"kind"}, nil),
		xids: prometheus.NewDesc("relayd_postgres_horizon_age_xids",
			"How many transaction ids old the horizon of the oldest holder of each kind is.", []string{"kind"}, nil),
		holder: prometheus.NewDesc("relayd_postgres_horizon_holder_info",
			"1 for each kind's oldest holder of the horizon, once it has held it for a minute: its pid (0: not a session), name (application_name, gid or slot) and state.", []string{"kind", "pid", "name", "state"}, nil),
		dead: prometheus.NewDesc("relayd_postgres_dead_tuples",
			"Row versions of relayd's table (outbox, owed, delivered) that VACUUM has not removed yet (the statistics collector's estimate).", []string{"table"}, nil),
		size: prometheus.NewDesc("relayd_postgres_table_bytes",
			"Size of relayd's table (outbox, owed, delivered) on disk, with its indexes and TOAST.", []string{"table"}, nil),
	}
	reg.MustRegister(p)
	return p
}

// Describe implements prometheus.Collector.
func (p *Postgres) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{p.age, p.xids, p.holder, p.dead, p.size} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (p *Postgres) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range p.health.Horizon {
		ch <- prometheus.MustNewConstMetric(p.age, prometheus.GaugeValue, h.Age.Seconds(), h.Kind)
		ch <- prometheus.MustNewConstMetric(p.xids, prometheus.GaugeValue, float64(h.XIDs), h.Kind)
		if h.Age >= HolderInfoAfter {
			ch <- prometheus.MustNewConstMetric(p.holder, prometheus.GaugeValue, 1, h.Kind, fmt.Sprint(h.PID), h.Name, h.State)
		}
	}
	for _, t := range p.health.Tables {
		ch <- prometheus.MustNewConstMetric(p.dead, prometheus.GaugeValue, float64(t.DeadTuples), t.Table)
		ch <- prometheus.MustNewConstMetric(p.size, prometheus.GaugeValue, float64(t.Bytes), t.Table)
	}
}

// Set replaces the figures. A holder whose age Postgres does not give is
// aged from the first Set that read it.
func (p *Postgres) Set(h pghealth.Health) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	seen := make(map[string]time.Time, len(h.Horizon))
	for i := range h.Horizon {
		x := &h.Horizon[i]
		key := fmt.Sprint(x.Kind, "\x00", x.PID, "\x00", x.Name, "\x00", x.Horizon)
		first, ok := p.seen[key]
		if !ok {
			first = now
		}
		seen[key] = first
		if !x.AgeKnown {
			x.Age = now.Sub(first)
		}
	}
	p.health, p.at, p.seen = h, now, seen
}

// Last returns a copy of the figures Set was last given, with the ages it
// worked out, and when; at is zero before the first Set.
func (p *Postgres) Last() (h pghealth.Health, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h = p.health
	h.Horizon, h.Tables = slices.Clone(h.Horizon), slices.Clone(h.Tables)
	return h, p.at
}

// Run reads the figures every interval until ctx is done (see poll).
func (p *Postgres) Run(ctx context.Context, interval time.Duration, read func(context.Context) (pghealth.Health, error), log *slog.Logger) {
	poll(ctx, interval, read, p.Set, log, "postgres health")
}
