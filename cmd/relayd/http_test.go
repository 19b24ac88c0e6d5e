package main

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/metrics"
	"github.com/relayd/relayd/internal/pghealth"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/relay"
)

// The profiler is served only when RELAY_PPROF asks for it.
func TestPProfOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		srv, err := startHTTP("127.0.0.1:0", on, prometheus.NewRegistry(), noProbe, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		addr := srv.Addr
		for _, path := range []string{"/healthz", "/debug/pprof/"} {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			want := http.StatusOK
			if path == "/debug/pprof/" && !on {
				want = http.StatusNotFound
			}
			if resp.StatusCode != want {
				t.Errorf("pprof %v: GET %s = %d, want %d", on, path, resp.StatusCode, want)
			}
		}
	}
}

// /readyz says which phase the relay runs, and why, ready or not.
func TestRunningPhaseLine(t *testing.T) {
	amqp, nats, dual := []relay.Target{relay.TargetAMQP}, []relay.Target{relay.TargetNATS}, relay.Targets
	for _, tc := range []struct {
		s    relay.PhaseState
		want string
	}{
		{relay.PhaseState{Running: dual}, "phase dual (no phase set on the table: relayd phase set)"},
		{relay.PhaseState{Running: dual, Table: dual}, "phase dual (the table's)"},
		{relay.PhaseState{Running: amqp, Table: dual, Pinned: true}, "phase amqp (pinned by RELAY_TARGETS); the table's phase is dual"},
		{relay.PhaseState{Running: dual, Table: dual, Finishing: nats}, "phase dual (the table's); batches of phase nats still in flight"},
	} {
		if got := runningPhaseLine(tc.s); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.s, got, tc.want)
		}
	}
}

// A relay's row reports the phase its batches in flight run until they end.
func TestReportedPhase(t *testing.T) {
	for _, tc := range []struct {
		s    relay.PhaseState
		want phase.Name
	}{
		{relay.PhaseState{Running: relay.Targets}, phase.Dual},
		{relay.PhaseState{Running: relay.Targets, Finishing: []relay.Target{relay.TargetNATS}}, phase.NATS},
		{relay.PhaseState{Running: []relay.Target{relay.TargetNATS}, Finishing: relay.Targets}, phase.Dual},
	} {
		if got := reportedPhase(tc.s); got != tc.want {
			t.Errorf("%+v: reported %s, want %s", tc.s, got, tc.want)
		}
	}
}

// Every relayd_* (and go_*, process_*) series run and backfill serve carries
// outbox, the configured RELAY_OUTBOX_TABLE: one Prometheus scrapes the relayd
// of many outboxes. The Postgres gauges' table label stays beside it.
func TestMetricsCarryTheOutbox(t *testing.T) {
	for _, table := range []string{"", "orders.outbox"} {
		env := map[string]string{"RELAY_DATABASE_URL": "postgres://unused"}
		want := "outbox" // the default
		if table != "" {
			env["RELAY_OUTBOX_TABLE"], want = table, table
		}
		cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
		if err != nil {
			t.Fatal(err)
		}
		// What run registers, with figures so that every family exports.
		runServed, reg := newMetricsRegistry(cfg.table)
		m := metrics.NewRelay(reg, "test")
		m.PublishFailed(relay.TargetAMQP, nil)
		m.Parked(relay.TargetNATS)
		m.Phase(relay.PhaseState{Running: relay.Targets, Table: relay.Targets})
		metrics.NewOutbox(reg).Set([]relay.TargetStats{{Target: relay.TargetAMQP, Pending: 1}})
		metrics.NewPostgres(reg).Set(pghealth.Health{
			Horizon: []pghealth.Holder{{Kind: "snapshot", Age: time.Hour, AgeKnown: true}},
			Tables:  []pghealth.Table{{Table: "delivered", Bytes: 8192}}})
		// What backfill registers.
		backfillServed, reg := newMetricsRegistry(cfg.table)
		(&reporter{}).register(reg)

		seen := map[string]bool{}
		for cmd, served := range map[string]*prometheus.Registry{"run": runServed, "backfill": backfillServed} {
			for name, fam := range scrapeMetrics(t, served) {
				if strings.HasPrefix(name, "promhttp_") { // the handler's own, not the commands'
					continue
				}
				seen[name] = true
				for _, s := range fam.GetMetric() {
					got := map[string]string{}
					for _, l := range s.GetLabel() {
						got[l.GetName()] = l.GetValue()
					}
					if got["outbox"] != want {
						t.Errorf("RELAY_OUTBOX_TABLE=%q: relayd %s serves %s %v, want outbox=%q", table, cmd, name, got, want)
					}
					if name == "relayd_postgres_table_bytes" && got["table"] != "delivered" {
						t.Errorf("relayd %s serves %s %v, want table=delivered beside outbox", cmd, name, got)
					}
				}
			}
		}
		for _, name := range []string{"relayd_build_info", "relayd_outbox_lag_seconds", "relayd_publish_errors_total",
			"relayd_postgres_table_bytes", "relayd_backfill_moved_total", "go_goroutines"} {
			if !seen[name] {
				t.Errorf("RELAY_OUTBOX_TABLE=%q: /metrics serves no %s (served: %v)", table, name, slices.Sorted(maps.Keys(seen)))
			}
		}
	}
}

// scrapeMetrics serves reg as run and backfill do and reads /metrics.
func scrapeMetrics(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv, err := startHTTP("127.0.0.1:0", false, reg, noProbe, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	resp, err := http.Get("http://" + srv.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}
