package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relayd/relayd/internal/errlog"
)

// Tracing is off unless an OTLP exporter is asked for, and OTEL_SDK_DISABLED
// wins; the protocol defaults to http/protobuf, the traces variable first.
func TestReadTracingSettings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		on       bool
		protocol string
		err      bool
	}{
		{"nothing set", nil, false, "", false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true, "http/protobuf", false},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true, "http/protobuf", false},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, "http/protobuf", false},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false, "", false},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false, "", false},
		{"sdk disabled false", map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, true, "http/protobuf", false},
		{"grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, "grpc", false},
		{"traces protocol wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, true, "http/protobuf", false},
		{"http/json", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, true, "http/json", true},
		{"other exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := readTracingSettings(envconfig.MapLookuper(tc.env))
			if (err != nil) != tc.err || s.on != tc.on || s.protocol != tc.protocol {
				t.Fatalf("got %+v, %v; want on=%v protocol=%q error=%v", s, err, tc.on, tc.protocol, tc.err)
			}
		})
	}
}

// Off, setupTracing hands the relay no provider at all: the relay then does
// no tracing work per row.
func TestSetupTracingOff(t *testing.T) {
	tp, stop, err := setupTracing(context.Background(), envconfig.MapLookuper(nil), slog.New(slog.DiscardHandler))
	if err != nil || tp != nil {
		t.Fatalf("got %v, %v; want a nil provider", tp, err)
	}
	stop()
}

type flakyExporter struct {
	sdktrace.SpanExporter
	err error
}

func (f *flakyExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return f.err }

// A failing export is logged (once, not again by otel's handler) and so is
// the recovery.
func TestLoggedExporter(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	inner := &flakyExporter{err: errors.New("connection refused")}
	e := loggedExporter{inner, errlog.New(log, "trace export")}
	if err := e.ExportSpans(context.Background(), nil); err != nil {
		t.Fatalf("ExportSpans = %v, want nil (logged here)", err)
	}
	inner.err = nil
	e.ExportSpans(context.Background(), nil)
	out := buf.String()
	if !strings.Contains(out, `msg="trace export failed" error="connection refused"`) || !strings.Contains(out, `msg="trace export recovered"`) {
		t.Fatalf("log:\n%s\nwant the failure and the recovery", out)
	}
}

// Over grpc to a collector that is not there, the spans are given up at
// exit within tracingFlushWait, and the loss is logged.
func TestSetupTracingGRPCFlushIsBounded(t *testing.T) {
	// The exporter reads its endpoint from the process environment.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	env := envconfig.MapLookuper(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
	var buf syncWriter
	tp, stop, err := setupTracing(context.Background(), env, slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil || tp == nil {
		t.Fatalf("setupTracing: %v, %v; want a provider", tp, err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "s")
	span.End()
	start := time.Now()
	stop()
	if took := time.Since(start); took > tracingFlushWait+2*time.Second {
		t.Fatalf("stop took %v, want at most about %v", took, tracingFlushWait)
	}
	if out := buf.String(); !strings.Contains(out, "trace export failed") && !strings.Contains(out, "spans not all exported at exit") {
		t.Fatalf("log:\n%s\nwant the spans said lost", out)
	}
}

type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
