package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// readiness reports what relayd depends on and cannot use: Postgres, and
// each enabled broker that is disconnected or that the relay paused after
// failed publishes; empty down means ready. detail says the phase.
func readiness(pool *pgxpool.Pool, r *relay.Relay) probe {
	return func(ctx context.Context) (down, detail []string) {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			down = append(down, "postgres: "+err.Error())
		}
		return append(down, r.Unready()...), []string{runningPhaseLine(r.Phase())}
	}
}

// probe is what /readyz reports: what is down (empty: ready), and lines of
// detail printed either way.
type probe func(context.Context) (down, detail []string)

// noProbe is a command's probe that depends on nothing but itself.
func noProbe(context.Context) (down, detail []string) { return nil, nil }

// newMetricsRegistry returns the registry run and backfill serve on /metrics
// and the Registerer their metrics go on, which labels every series
// outbox=RELAY_OUTBOX_TABLE: one Prometheus scrapes the relayd of many outboxes.
func newMetricsRegistry(table schema.Table) (*prometheus.Registry, prometheus.Registerer) {
	reg := prometheus.NewRegistry()
	return reg, withOutboxLabel(reg, table)
}

func withOutboxLabel(reg prometheus.Registerer, table schema.Table) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"outbox": table.String()}, reg)
}

// startHTTP serves /metrics, the probes and /version on addr, and whatever
// more adds (relayd run's console; nil for none).
func startHTTP(addr string, pprofOn bool, reg *prometheus.Registry, ready probe, more func(*http.ServeMux), log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		down, detail := ready(r.Context())
		if len(down) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			down = []string{"ok"}
		}
		for _, d := range append(down, detail...) {
			fmt.Fprintln(w, d)
		}
	})
	mux.HandleFunc("/version", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, version+"\n") })
	if pprofOn {
		// Go's profiler, for finding where time goes (go tool pprof
		// http://ADDR/debug/pprof/profile). Off by default: it is not for
		// the open network.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if more != nil {
		more(mux)
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "error", err.Error())
		}
	}()
	log.Info("metrics listening", "addr", ln.Addr().String())
	return srv, nil
}
