package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// scrape reads one gauge or counter per target label from /metrics.
func scrape(t *testing.T, addr, name string) map[string]float64 {
	t.Helper()
	return scrapeBy(t, addr, name, "target")
}

// scrapeFamilies reads every metric family addr serves on /metrics.
func scrapeFamilies(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return fams
}

// scrapeBy reads one gauge or counter per value of label from /metrics.
func scrapeBy(t *testing.T, addr, name, label string) map[string]float64 {
	t.Helper()
	fams := scrapeFamilies(t, addr)
	out := map[string]float64{}
	fam, ok := fams[name]
	if !ok {
		return out
	}
	for _, m := range fam.GetMetric() {
		target := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				target = l.GetValue()
			}
		}
		switch {
		case m.Gauge != nil:
			out[target] = m.GetGauge().GetValue()
		case m.Counter != nil: // summed over the other labels
			out[target] += m.GetCounter().GetValue()
		}
	}
	return out
}

// requireOutboxLabel fails unless every relayd_* series addr serves carries
// outbox=table, the RELAY_OUTBOX_TABLE: one Prometheus scrapes many outboxes.
func requireOutboxLabel(t *testing.T, addr, table string) {
	t.Helper()
	fams := scrapeFamilies(t, addr)
	n := 0
	for name, fam := range fams {
		if !strings.HasPrefix(name, "relayd_") {
			continue
		}
		n++
		for _, m := range fam.GetMetric() {
			got := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "outbox" {
					got = l.GetValue()
				}
			}
			if got != table {
				t.Errorf("%s: %s %v has outbox=%q, want %q", addr, name, m.GetLabel(), got, table)
			}
		}
	}
	if n == 0 {
		t.Errorf("%s serves no relayd_* metric", addr)
	}
}

func readyz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// relayd runs on one P unless GOMAXPROCS says otherwise (cmd/relayd
// procs.go): /metrics and the start line show the value in force.
func TestGOMAXPROCSDefaultsToOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct {
		env  []string
		want float64
	}{{nil, 1}, {[]string{"GOMAXPROCS=2"}, 2}} {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		r := e.startRelay(fmt.Sprintf("relay %v", tc.env), append([]string{"RELAY_METRICS_ADDR=" + addr}, tc.env...)...)
		if got, ok := scrape(t, addr, "go_sched_gomaxprocs_threads")[""]; !ok || got != tc.want {
			t.Errorf("env %v: go_sched_gomaxprocs_threads = %v (present %v), want %v", tc.env, got, ok, tc.want)
		}
		if want := fmt.Sprintf("gomaxprocs=%v", tc.want); !strings.Contains(r.out.String(), want) {
			t.Errorf("env %v: start line lacks %s:\n%s", tc.env, want, r.out.String())
		}
		if code := r.stop(30 * time.Second); code != 0 {
			t.Errorf("env %v: exit %d", tc.env, code)
		}
	}
}

// With NATS cut off and rows pending, the nats lag gauge rises with the age
// of the oldest pending row while the amqp one stays near 0; /readyz fails.
// Once NATS is back, both recover by themselves.
func TestLagGaugeAndReadinessFollowAnOutage(t *testing.T) {
	t.Parallel()
	port, dir := freePort(t), t.TempDir()
	ns := startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	e := newEnv(t, fmt.Sprintf("nats://127.0.0.1:%d", port))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r := e.startRelay("relay", "RELAY_METRICS_ADDR="+addr, "RELAY_STATS_INTERVAL=200ms", "RELAY_PUBLISH_TIMEOUT=2s")
	ctx := context.Background()
	write := func(n int) {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "orders.lag", Payload: []byte("x")}
		}
		if _, err := e.writer.Write(ctx, e.pool, msgs...); err != nil {
			t.Fatal(err)
		}
	}

	write(10)
	e.waitDelivered(30 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool {
		lag := scrape(t, addr, "relayd_outbox_lag_seconds")
		return len(lag) == 2 && lag["nats"] == 0 && lag["amqp"] == 0
	}, "lag gauges not 0 when idle")
	if code, body := readyz(addr); code != 200 {
		t.Fatalf("/readyz %d %q with everything up", code, body)
	}

	ns.Shutdown()
	ns.WaitForShutdown()
	write(10)
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := readyz(addr)
		return code == 503 && strings.Contains(body, "nats")
	}, "/readyz did not fail with NATS down")

	var first map[string]float64
	testenv.Eventually(t, 10*time.Second, func() bool {
		first = scrape(t, addr, "relayd_outbox_lag_seconds")
		return first["nats"] > 0.5
	}, "nats lag did not rise")
	// The oldest pending row was written before this instant, so the gauge
	// must be at least its age by now.
	written := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool {
		lag := scrape(t, addr, "relayd_outbox_lag_seconds")
		return lag["nats"] >= first["nats"]+1 && lag["nats"] >= time.Since(written).Seconds()
	}, "nats lag did not keep rising with the oldest row's age")
	lag := scrape(t, addr, "relayd_outbox_lag_seconds")
	if lag["amqp"] > 1 {
		t.Fatalf("amqp lag %.2fs while only NATS is down, want near 0", lag["amqp"])
	}
	if p := scrape(t, addr, "relayd_outbox_pending_messages"); p["nats"] < 10 || p["amqp"] != 0 {
		t.Fatalf("pending %v, want nats >= 10 and amqp 0", p)
	}

	ns = startNATS(t, port, dir)
	t.Cleanup(func() { ns.Shutdown() })
	e.waitDelivered(60 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool {
		lag := scrape(t, addr, "relayd_outbox_lag_seconds")
		return lag["nats"] == 0 && lag["amqp"] == 0
	}, "nats lag did not return to 0")
	testenv.Eventually(t, 10*time.Second, func() bool { code, _ := readyz(addr); return code == 200 }, "/readyz did not recover")
	if pub := scrape(t, addr, "relayd_published_total"); pub["nats"] < 20 || pub["amqp"] < 20 {
		t.Fatalf("published_total %v, want >= 20 per target", pub)
	}
	// What the database does to relayd's tables is read on the same interval.
	if size := scrapeBy(t, addr, "relayd_postgres_table_bytes", "table"); size["outbox"] <= 0 || size["owed"] <= 0 || size["delivered"] <= 0 {
		t.Fatalf("relayd_postgres_table_bytes %v, want each table's size", size)
	}
	requireOutboxLabel(t, addr, e.table.String())
	if !r.running() {
		t.Fatal("relayd exited")
	}
}

// traceparent and tracestate in a row's headers reach both brokers
// unchanged, so a trace continues across the relay.
func TestTraceContextReachesBothBrokers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startRelay("relay")
	ctx := context.Background()
	hdr := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
	}
	ids, err := e.writer.Write(ctx, e.pool, outbox.Message{Topic: "orders.traced", Payload: []byte("{}"), Headers: hdr})
	if err != nil {
		t.Fatal(err)
	}
	e.waitDelivered(30 * time.Second)

	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, e.prefix+"orders.traced")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get("Nats-Msg-Id"); got != ids[0] {
		t.Fatalf("Nats-Msg-Id %q, want %q", got, ids[0])
	}
	ch, err := e.amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	d, ok, err := ch.Get(e.queue, true)
	if err != nil || !ok {
		t.Fatalf("amqp get: %v, %v", ok, err)
	}
	// No content type: the row's headers give none (see amqpsink.Publishing).
	if d.MessageId != ids[0] || d.DeliveryMode != 2 || d.Timestamp.IsZero() || d.ContentType != "" {
		t.Fatalf("amqp properties: id %q mode %d timestamp %v content-type %q", d.MessageId, d.DeliveryMode, d.Timestamp, d.ContentType)
	}
	for k, v := range hdr {
		if got := m.Header.Get(k); got != v {
			t.Errorf("nats header %s = %q, want %q", k, got, v)
		}
		if got, _ := d.Headers[k].(string); got != v {
			t.Errorf("amqp header %s = %q, want %q", k, got, v)
		}
	}
}
