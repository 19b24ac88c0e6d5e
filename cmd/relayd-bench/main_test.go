package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// TestSmoke runs the whole benchmark small (-smoke) against the real
// services and checks that the JSON has every section with figures in it,
// so that `make bench` cannot rot between the times someone runs it. The
// figures themselves mean nothing at this size, least of all under -race.
func TestSmoke(t *testing.T) {
	o := smokeOptions(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	res, err := run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bench-results.json")
	if err := writeJSON(path, res); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}

	positive := func(where string, obj any, keys ...string) {
		t.Helper()
		m, ok := obj.(map[string]any)
		if !ok {
			t.Errorf("%s: not an object: %v", where, obj)
			return
		}
		for _, k := range keys {
			if v, ok := m[k].(float64); !ok || v <= 0 {
				t.Errorf("%s: %s = %v, want a positive number", where, k, m[k])
			}
		}
	}
	list := func(key string, want int) []any {
		t.Helper()
		l, _ := doc[key].([]any)
		if len(l) != want {
			t.Errorf("%s: %d entries, want %d:\n%s", key, len(l), want, data)
		}
		return l
	}

	positive("machine", doc["machine"], "cpus", "memory_gib")
	positive("results", doc, "wall_seconds", "payload_bytes", "relayd_peak_rss_mib")
	if doc["smoke"] != true {
		t.Errorf("smoke = %v, want true", doc["smoke"])
	}
	keys := map[string]bool{}
	for _, c := range list("ceilings", 7) {
		positive("ceiling", c, "messages", "seconds", "per_second")
		cm := c.(map[string]any)
		key := cm["key"].(string)
		keys[key] = true
		// The ceilings the burn-downs and the backfill are set against
		// are the best of two samples taken apart.
		if key == ceilJetStream || key == ceilPostgres || key == ceilAMQPRelayd || key == ceilAMQPConsume {
			if samples, _ := cm["samples_per_second"].([]any); len(samples) != 2 {
				t.Errorf("ceiling %s: samples %v, want 2", key, cm["samples_per_second"])
			}
		}
	}
	for _, k := range []string{ceilJetStream, ceilAMQPRelayd, ceilAMQPPlain, ceilPostgres, ceilAMQPConsume, ceilCommitNotify, ceilCommitPlain} {
		if !keys[k] {
			t.Errorf("ceiling %s missing", k)
		}
	}
	for _, bd := range list("burndown", len(o.BurnTargets)*len(o.BurnInstances)+len(o.BurnKeyed)) {
		positive("burndown "+bd.(map[string]any)["targets"].(string), bd,
			"instances", "rows", "seconds", "rows_per_second", "cpu_seconds_per_10k_rows", "peak_rss_mib", "ceiling_per_second", "ratio")
	}
	tr, _ := doc["tracing"].(map[string]any)
	positive("tracing", tr, "rows", "rounds", "sampled_percent", "ratio")
	positive("tracing off", tr["off"], "rows_per_second", "cpu_seconds_per_10k_rows", "peak_rss_mib")
	positive("tracing on", tr["on"], "rows_per_second", "cpu_seconds_per_10k_rows", "peak_rss_mib", "otlp_export_requests", "otlp_export_bytes")
	if off, _ := tr["off"].(map[string]any); off["otlp_export_requests"] != float64(0) {
		t.Errorf("tracing off: %v export requests, want 0", off["otlp_export_requests"])
	}
	if runs, _ := tr["runs"].([]any); len(runs) != 4 {
		t.Errorf("tracing: %d runs, want 4 (2 per arm in a smoke run)", len(runs))
	}
	rt, _ := doc["routes"].(map[string]any)
	positive("routes", rt, "rows", "topics", "rounds", "ratio")
	positive("routes default", rt["default"], "rows_per_second", "cpu_seconds_per_10k_rows", "peak_rss_mib")
	positive("routes routed", rt["routed"], "rows_per_second", "cpu_seconds_per_10k_rows", "peak_rss_mib")
	if runs, _ := rt["runs"].([]any); len(runs) != 2 {
		t.Errorf("routes: %d runs, want 2 (1 per arm in a smoke run)", len(runs))
	}
	for _, n := range res.Notes {
		if strings.HasPrefix(n, "routes") {
			t.Errorf("routes: the brokers do not hold what the outbox says: %s", n)
		}
	}
	for _, l := range list("latency", 2) {
		positive("latency", l, "rate_per_second", "rows_per_commit", "committed", "received",
			"p50_ms", "p90_ms", "p99_ms", "max_ms", "achieved_rate_per_second", "cpu_seconds_per_10k_rows", "peak_rss_mib")
	}
	positive("backfill", doc["backfill"], "messages", "moved", "seconds", "per_second", "cpu_seconds_per_10k_messages", "peak_rss_mib", "ceiling_per_second", "ratio")
	positive("replay", doc["replay"], "messages", "sent", "received", "seconds", "per_second", "process_seconds", "cpu_seconds_per_10k_messages", "peak_rss_mib", "ceiling_per_second", "ratio")
	if rp, _ := doc["replay"].(map[string]any); rp != nil {
		positive("replay dry run", rp["dry_run"], "read", "would_send", "seconds", "per_second", "cpu_seconds_per_10k_messages")
	}
	pd, _ := doc["producers"].(map[string]any)
	runs, _ := pd["runs"].([]any)
	if len(runs) != len(producerClients) {
		t.Errorf("producers: %d runs, want %d", len(runs), len(producerClients))
	}
	for _, run := range runs {
		positive("producers", run, "clients", "bare_commits_per_second", "outbox_commits_per_second",
			"outbox_after_killed_relay_commits_per_second", "ratio", "after_killed_relay_ratio")
	}
	positive("producers, bare latency", pd["bare_commit_latency"], "commits_per_second", "p50_ms", "p99_ms")
	positive("producers, outbox latency", pd["outbox_commit_latency"], "commits_per_second", "p50_ms", "p99_ms")
	positive("producers, idle relay", pd["idle_relay_latency"], "rows", "p50_ms", "max_ms")
	// dual ×2, nats ×2, keyed dual ×1, tracing, routes, latency ×2,
	// backfill, RSS; producers ×2 per connection count, idle latency.
	for _, v := range list("targets", 11+2*len(producerClients)+1) {
		positive("target "+v.(map[string]any)["target"].(string), v, "value", "limit")
	}

	var table bytes.Buffer
	writeTable(&table, res)
	for _, want := range []string{"| ceiling", "| relayd |", "| tracing:", "| latency", "| producers", "| target |", "targets met"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	t.Logf("\n%s", table.String())
}

// smokeOptions is -smoke against the test services, logging to t.
func smokeOptions(t *testing.T) options {
	o := defaultOptions(true)
	o.DatabaseURL = testenv.DatabaseURL(t)
	o.AMQPURL = testenv.AMQPURL(t)
	o.NATSURL = testenv.NATSURL(t)
	o.Version = "smoke-test"
	o.Log = testLog{t}
	return o
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestHorizonSmoke runs the long-transaction soak small (-smoke -only
// horizon), which the whole run leaves out: each kind's windows, warm-up,
// baseline, hold and after, with rows, latencies and WAL flushes, and the
// held row's arrival.
func TestHorizonSmoke(t *testing.T) {
	o := smokeOptions(t)
	o.Only = onlyFlag("horizon")
	// Its held snapshot would hold back the other tests' CREATE INDEX
	// CONCURRENTLY in the shared database.
	o.DatabaseURL = testenv.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Horizon) != len(horizonKinds) {
		t.Fatalf("%d horizon runs, want %d", len(res.Horizon), len(horizonKinds))
	}
	for _, h := range res.Horizon {
		phases := map[string]int{}
		for _, w := range h.Windows {
			phases[w.Phase]++
			if w.Rows == 0 || w.P99Ms <= 0 || w.WALFlushes <= 0 {
				t.Errorf("%s, window at %.0f s (%s): %d rows, p99 %v ms, %v WAL flushes/10k; want rows, a latency and the producers' flushes",
					h.Kind, w.StartSeconds, w.Phase, w.Rows, w.P99Ms, w.WALFlushes)
			}
		}
		if phases["warm-up"] != 1 || phases["baseline"] != 1 || phases["hold"] < 2 || phases["after"] != 1 {
			t.Errorf("%s: windows by phase %v, want 1 warm-up, 1 baseline, the hold's, 1 after", h.Kind, phases)
		}
		if h.BytesBefore <= 0 || h.BytesHoldEnd <= h.BytesBefore || h.BytesAfterVacuum <= 0 {
			t.Errorf("%s: outbox %d bytes before, %d at the hold's end, %d after VACUUM; want it grown during the hold", h.Kind, h.BytesBefore, h.BytesHoldEnd, h.BytesAfterVacuum)
		}
		if h.Kind == "producer transaction" && (h.HeldRowMissing || h.HeldRowMs <= 0) {
			t.Errorf("the held row: %v ms, missing %v; want its arrival", h.HeldRowMs, h.HeldRowMissing)
		}
	}
	var table bytes.Buffer
	writeTable(&table, res)
	if !strings.Contains(table.String(), "**repeatable read snapshot held 10s**") {
		t.Errorf("the table has no horizon section:\n%s", table.String())
	}
}
