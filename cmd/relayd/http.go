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
)

// readiness reports what relayd depends on and cannot use: Postgres, and
// each enabled broker that is disconnected or that the relay paused after
// failed publishes. Empty means ready.
func readiness(pool *pgxpool.Pool, r *relay.Relay) func(context.Context) []string {
	return func(ctx context.Context) []string {
		var down []string
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			down = append(down, "postgres: "+err.Error())
		}
		return append(down, r.Unready()...)
	}
}

func startHTTP(addr string, pprofOn bool, reg *prometheus.Registry, ready func(context.Context) []string, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if down := ready(r.Context()); len(down) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, d := range down {
				fmt.Fprintln(w, d)
			}
			return
		}
		io.WriteString(w, "ok\n")
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
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "error", err.Error())
		}
	}()
	log.Info("metrics listening", "addr", ln.Addr().String())
	return srv, nil
}
