package inbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// StartSpan starts the consumer's span for m, from either broker: a
// CONSUMER span "process <subject>" whose parent is the context in m's
// traceparent (and tracestate) header — relayd's span of the publish that
// brought it, so the consumer's work hangs under relayd's in the trace. A
// message without a valid traceparent gets ctx's span, if any, as parent.
// End the span when the message is handled:
//
//	ctx, span := inbox.StartSpan(ctx, tracer, inbox.AMQPMessage(d))
//	defer span.End()
//	_, err := in.Process(ctx, m, handle)
func StartSpan(ctx context.Context, tracer trace.Tracer, m Message) (context.Context, trace.Span) {
	if len(m.Headers) > 0 {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(m.Headers))
	}
	system := semconv.MessagingSystemRabbitMQ
	if m.Source == SourceNATS {
		system = semconv.MessagingSystemKey.String("nats")
	}
	attrs := []attribute.KeyValue{system, semconv.MessagingDestinationName(m.Subject),
		semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process")}
	if m.ID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(m.ID))
	}
	return tracer.Start(ctx, "process "+m.Subject, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}
