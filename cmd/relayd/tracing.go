package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/sethvargo/go-envconfig"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayd/relayd/internal/errlog"
)

// tracingFlushWait bounds the export of the last spans at exit.
const tracingFlushWait = 5 * time.Second

// tracingSettings is what the OTEL_* environment asks of relayd's tracing.
type tracingSettings struct {
	on       bool
	protocol string // "grpc" or "http/protobuf"
}

// readTracingSettings reads the OTEL_* variables that decide whether relayd
// exports traces and how; the SDK and the exporter read the rest (sampler,
// endpoint, headers, timeouts) themselves. Tracing is on when
// OTEL_TRACES_EXPORTER is otlp, or unset with an OTLP endpoint given, and
// OTEL_SDK_DISABLED is not true.
func readTracingSettings(env envconfig.Lookuper) (tracingSettings, error) {
	get := func(k string) string { v, _ := env.Lookup(k); return strings.TrimSpace(v) }
	var s tracingSettings
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return s, nil
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "":
		s.on = get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	case "otlp":
		s.on = true
	case "none":
	default:
		return s, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: relayd exports otlp or none", exp)
	}
	if !s.on {
		return s, nil
	}
	s.protocol = cmp.Or(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), get("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	if s.protocol != "grpc" && s.protocol != "http/protobuf" {
		return s, fmt.Errorf("OTLP protocol %q: relayd exports grpc or http/protobuf", s.protocol)
	}
	return s, nil
}

// setupTracing returns the tracer provider relayd's spans go to, nil when
// tracing is off, and a shutdown that exports what is left, waiting at most
// tracingFlushWait.
func setupTracing(ctx context.Context, env envconfig.Lookuper, log *slog.Logger) (trace.TracerProvider, func(), error) {
	s, err := readTracingSettings(env)
	if err != nil || !s.on {
		return nil, func() {}, err
	}
	var exp sdktrace.SpanExporter
	if s.protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, func() {}, fmt.Errorf("otlp trace exporter: %w", err)
	}
	instance := uuid.NewString()
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("relayd"), semconv.ServiceVersion(version), semconv.ServiceInstanceID(instance)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: over the defaults above
		resource.WithHost(), resource.WithProcessPID(), resource.WithTelemetrySDK())
	if err != nil {
		// A partial resource is still a resource: trace with what it has.
		log.Warn("tracing: resource incomplete", "error", err.Error())
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(errlog.New(log, "tracing").Error))
	// The sampler is the SDK's: OTEL_TRACES_SAMPLER (default
	// parentbased_always_on) and OTEL_TRACES_SAMPLER_ARG.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(loggedExporter{exp, errlog.New(log, "trace export")}), sdktrace.WithResource(res))
	log.Info("tracing on", "protocol", s.protocol, "service_instance_id", instance)
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushWait)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("tracing: spans not all exported at exit", "error", err.Error())
		}
	}, nil
}

// loggedExporter logs its exporter's failures, rate-limited, and once when
// exports succeed again; the batch processor drops the spans either way.
type loggedExporter struct {
	sdktrace.SpanExporter
	errs *errlog.Limiter
}

func (e loggedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if err := e.SpanExporter.ExportSpans(ctx, spans); err != nil {
		e.errs.Error(err)
		return nil // logged: not again through otel's error handler
	}
	e.errs.OK()
	return nil
}
