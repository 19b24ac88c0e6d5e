package main

import (
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/phase"
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
