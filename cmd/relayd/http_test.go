package main

import (
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/relay"
)

// The profiler is served only when RELAY_PPROF asks for it.
func TestPProfOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		srv, err := startHTTP("127.0.0.1:0", on, prometheus.NewRegistry(), noProbe, slog.New(slog.DiscardHandler))
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
	amqp, dual := []relay.Target{relay.TargetAMQP}, relay.Targets
	for _, tc := range []struct {
		s    relay.PhaseState
		want string
	}{
		{relay.PhaseState{Running: dual}, "phase dual (no phase set on the table: relayd phase set)"},
		{relay.PhaseState{Running: dual, Table: dual}, "phase dual (the table's)"},
		{relay.PhaseState{Running: amqp, Table: dual, Pinned: true}, "phase amqp (pinned by RELAY_TARGETS); the table's phase is dual"},
	} {
		if got := runningPhaseLine(tc.s); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.s, got, tc.want)
		}
	}
}
