package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestOTLPReceiver: an export request is answered 200 with an empty
// protobuf message and counted; anything else is not counted.
func TestOTLPReceiver(t *testing.T) {
	r, err := startOTLPReceiver()
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	resp, err := http.Post("http://"+r.addr+"/v1/traces", "application/x-protobuf", bytes.NewReader(make([]byte, 123)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-protobuf" || len(body) != 0 {
		t.Errorf("export: %s, %q, %d bytes; want 200, application/x-protobuf, empty", resp.Status, resp.Header.Get("Content-Type"), len(body))
	}
	if resp, err := http.Get("http://" + r.addr + "/v1/traces"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("GET /v1/traces: %s, want an error", resp.Status)
		}
	}
	if got, gotBytes := r.requests.Load(), r.bytes.Load(); got != 1 || gotBytes != 123 {
		t.Errorf("counted %d requests, %d bytes; want 1, 123", got, gotBytes)
	}
}

// TestTracingVerdict: the on/off ratio is set against 0.95 and shown in
// the table.
func TestTracingVerdict(t *testing.T) {
	r := &Results{Tracing: &Tracing{Targets: "amqp,nats", Instances: 1, Rows: 100000, SampledPercent: 1, Rounds: 3,
		Off:   TracingArm{RowsPerSecond: 10000, Samples: []float64{9000, 10000, 9500}},
		On:    TracingArm{RowsPerSecond: 9400, Samples: []float64{9400, 9000, 9100}, Exports: 12, ExportBytes: 4096},
		Ratio: 0.94, Order: []string{"off", "on", "off", "on", "off", "on"}}}
	r.evaluate()
	v := r.verdictFor("tracing at 1 %")
	if v == nil || v.Pass || v.Limit != 0.95 || v.Value != 0.94 {
		t.Fatalf("verdict %+v, want 0.94 ≥ 0.95 failing", v)
	}
	var b bytes.Buffer
	writeTable(&b, r)
	for _, want := range []string{"| tracing: burn-down amqp,nats, 100,000 rows, 1 instance, 1 % of the rows sampled", "| on / off: ≥ 0.95 **FAIL** | 0.940 |", "| 12, 4,096 B |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
