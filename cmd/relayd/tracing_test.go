package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/sethvargo/go-envconfig"
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
