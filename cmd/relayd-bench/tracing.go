package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Tracing is the cost of relayd's tracing (issue #32): the same dual-write
// burn-down with tracing off and on, the runs alternating, every row with
// a traceparent header, one in tracingSampledEvery sampled.
type Tracing struct {
	Targets        string  `json:"targets"`
	Instances      int     `json:"instances"`
	Rows           int     `json:"rows"`
	SampledPercent float64 `json:"sampled_percent"`
	Rounds         int     `json:"rounds"` // runs per arm
	// The relayd environment of the on arm, beside the burn-down's.
	OnEnv []string   `json:"on_env"`
	Off   TracingArm `json:"off"`
	On    TracingArm `json:"on"`
	Ratio float64    `json:"ratio"` // On.RowsPerSecond / Off.RowsPerSecond
	Order []string   `json:"order"` // the arms in the order they ran
	Runs  []Burndown `json:"runs"`  // every run, in that order
}

// TracingArm is one arm's runs: the best of them counts, as with the
// ceilings and the producers.
type TracingArm struct {
	RowsPerSecond    float64   `json:"rows_per_second"` // the best run
	Samples          []float64 `json:"samples_rows_per_second"`
	CPUSecondsPer10k float64   `json:"cpu_seconds_per_10k_rows"` // of the best run
	PeakRSSMiB       float64   `json:"peak_rss_mib"`             // highest of the runs
	// What the bench's OTLP/HTTP receiver got during the arm's runs.
	Exports     int64 `json:"otlp_export_requests"`
	ExportBytes int64 `json:"otlp_export_bytes"`
}

const (
	// tracingSampledEvery: 1 % of the rows are sampled.
	tracingSampledEvery = 100
	// tracingRounds is how many runs each arm has, off and on taking turns.
	tracingRounds = 3
	// tracingTargets is the phase measured: dual write, one relayd.
	tracingTargets = "amqp,nats"
)

// tracingRows is the size of each run: half the burn-downs' (six runs must
// take a couple of minutes); a smoke run's whole burn-down size.
func (b *bench) tracingRows() int {
	if b.o.Smoke {
		return b.o.BurnRows
	}
	return b.o.BurnRows / 2
}

// tracing measures the dual-write burn-down with tracing off and on at 1 %
// sampling, against an OTLP/HTTP receiver of the bench's own; it fails when
// the on arm exported nothing or the off arm exported anything.
func (b *bench) tracing(ctx context.Context, res *Results) error {
	rcv, err := startOTLPReceiver()
	if err != nil {
		return err
	}
	defer rcv.close()
	rounds := tracingRounds
	if b.o.Smoke {
		rounds = 2
	}
	t := &Tracing{
		Targets: tracingTargets, Instances: 1, Rows: b.tracingRows(),
		SampledPercent: 100.0 / tracingSampledEvery, Rounds: rounds,
		// A short schedule delay, so that the batches are exported during
		// the run and not only at the exit's flush.
		OnEnv: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + rcv.addr, "OTEL_BSP_SCHEDULE_DELAY=500"},
	}
	res.Tracing = t
	var bestOff, bestOn Burndown
	for range rounds {
		for _, arm := range []struct {
			name string
			env  []string
			a    *TracingArm
			best *Burndown
		}{{"off", nil, &t.Off, &bestOff}, {"on", t.OnEnv, &t.On, &bestOn}} {
			b.logf("tracing %s: burn-down %s rows (1 %% sampled traceparent), RELAY_TARGETS=%s, 1 instance", arm.name, thousands(float64(t.Rows)), t.Targets)
			reqs0, bytes0 := rcv.requests.Load(), rcv.bytes.Load()
			bd, note, err := b.burndownRun(ctx, burnSpec{targets: t.Targets, instances: 1, rows: t.Rows, sampledEvery: tracingSampledEvery, env: arm.env})
			if err != nil {
				return fmt.Errorf("tracing %s: %w", arm.name, err)
			}
			reqs, bytes := rcv.requests.Load()-reqs0, rcv.bytes.Load()-bytes0
			b.logf("  %s rows/s, %.2f CPU s/10k rows, peak RSS %.0f MiB; %d OTLP export requests, %s bytes", thousands(bd.RowsPerSecond), bd.CPUSecondsPer10k, bd.PeakRSSMiB, reqs, thousands(float64(bytes)))
			if note != "" {
				res.Notes = append(res.Notes, "tracing "+arm.name+": "+note)
			}
			arm.a.Exports += reqs
			arm.a.ExportBytes += bytes
			arm.a.Samples = append(arm.a.Samples, bd.RowsPerSecond)
			arm.a.PeakRSSMiB = max(arm.a.PeakRSSMiB, bd.PeakRSSMiB)
			if bd.RowsPerSecond > arm.best.RowsPerSecond {
				*arm.best = bd
			}
			t.Order = append(t.Order, arm.name)
			t.Runs = append(t.Runs, bd)
			b.settle(ctx)
		}
	}
	t.Off.RowsPerSecond, t.Off.CPUSecondsPer10k = bestOff.RowsPerSecond, bestOff.CPUSecondsPer10k
	t.On.RowsPerSecond, t.On.CPUSecondsPer10k = bestOn.RowsPerSecond, bestOn.CPUSecondsPer10k
	if t.Off.RowsPerSecond > 0 {
		t.Ratio = round(t.On.RowsPerSecond/t.Off.RowsPerSecond, 3)
	}
	b.logf("tracing: on/off %.3f (best of %d each); OTLP export requests: on %d, off %d", t.Ratio, rounds, t.On.Exports, t.Off.Exports)
	var errs []error
	if t.On.Exports == 0 {
		errs = append(errs, fmt.Errorf("tracing on: relayd exported no spans to the receiver (%d sampled rows per run)", t.Rows/tracingSampledEvery))
	}
	if t.Off.Exports != 0 {
		errs = append(errs, fmt.Errorf("tracing off: the receiver got %d export requests, want 0", t.Off.Exports))
	}
	return errors.Join(errs...)
}

// otlpReceiver is an OTLP/HTTP trace receiver that counts the export
// requests and their bytes, and discards them.
type otlpReceiver struct {
	addr     string // host:port
	srv      *http.Server
	requests atomic.Int64
	bytes    atomic.Int64
}

func startOTLPReceiver() (*otlpReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("otlp receiver: %w", err)
	}
	r := &otlpReceiver{addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go r.srv.Serve(ln) //nolint:errcheck // ErrServerClosed at close
	return r, nil
}

// export answers an export request with an empty ExportTraceServiceResponse
// (an empty protobuf message is zero bytes): every span accepted.
func (r *otlpReceiver) export(w http.ResponseWriter, req *http.Request) {
	n, err := io.Copy(io.Discard, req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.requests.Add(1)
	r.bytes.Add(n)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

func (r *otlpReceiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.srv.Shutdown(ctx) //nolint:errcheck // best effort
}

// tracingTarget names the tracing section's target.
func tracingTarget(t *Tracing) string {
	return fmt.Sprintf("tracing at %s %%: burn-down %s ×%d rows/s, on vs off", strconv.FormatFloat(t.SampledPercent, 'f', -1, 64), t.Targets, t.Instances)
}

// writeTracing prints the tracing section: each arm's best run, its
// samples, and what the receiver got.
func writeTracing(w io.Writer, r *Results, t *Tracing) {
	fmt.Fprintf(w, "| tracing: burn-down %s, %s rows, %s, %s %% of the rows sampled (runs alternating %s) | rows/s (best of %d) | samples | relayd CPU s / 10k | peak RSS | OTLP exports (requests, bytes) |\n|---|---:|---|---:|---:|---:|\n",
		t.Targets, thousands(float64(t.Rows)), instances(t.Instances), strconv.FormatFloat(t.SampledPercent, 'f', -1, 64), strings.Join(t.Order, "/"), t.Rounds)
	for _, arm := range []struct {
		name string
		a    TracingArm
	}{{"off (no OTEL_* variable)", t.Off}, {"on (" + strings.Join(t.OnEnv, " ") + ")", t.On}} {
		samples := make([]string, len(arm.a.Samples))
		for i, s := range arm.a.Samples {
			samples[i] = thousands(s)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.2f | %.0f MiB | %s, %s B |\n", arm.name, thousands(arm.a.RowsPerSecond), strings.Join(samples, ", "),
			arm.a.CPUSecondsPer10k, arm.a.PeakRSSMiB, thousands(float64(arm.a.Exports)), thousands(float64(arm.a.ExportBytes)))
	}
	target := ""
	if v := r.verdictFor(tracingTarget(t)); v != nil {
		target = ": " + targetCell(v)
	}
	fmt.Fprintf(w, "| on / off%s | %s | | | | |\n\n", target, strconv.FormatFloat(t.Ratio, 'f', 3, 64))
}
