package main

import (
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
