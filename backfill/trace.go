package backfill

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the backfill's spans.
const tracerName = "github.com/relayd/relayd/backfill"

// startSpan starts the span of it's move (consume from RabbitMQ, publish to
// JetStream) when tracing is on and its traceparent header the sampler
// keeps: a child of the message's context, started when its batch was
// received. The JetStream copy then carries the span's traceparent.
func (b *runner) startSpan(it *item, received time.Time) {
	if b.tracer == nil {
		return
	}
	tp, ok := it.d.Headers["traceparent"].(string)
	if !ok {
		return
	}
	carrier := propagation.MapCarrier{"traceparent": tp}
	if ts, ok := it.d.Headers["tracestate"].(string); ok {
		carrier["tracestate"] = ts
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), carrier)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	_, span := b.tracer.Start(ctx, "send "+it.subject, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(received),
		trace.WithAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingDestinationName(it.subject),
			semconv.MessagingMessageID(it.id), semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
			semconv.MessagingRabbitMQDestinationRoutingKey(it.d.RoutingKey), queueKey.String(b.cfg.Queue)))
	if !span.SpanContext().IsSampled() {
		span.End()
		return
	}
	it.span = span
	if it.msg != nil {
		out := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), span.SpanContext()), out)
		for k, v := range out {
			it.msg.Header[k] = []string{v}
		}
	}
}

// queueKey is the attribute of a backfill span: the queue it drains.
const queueKey = attribute.Key("relayd.backfill.queue")

// endSpan ends it's span, if any, with outcome; reason, when not "", is
// an error status.
func (it *item) endSpan(outcome, reason string) {
	if it.span == nil {
		return
	}
	it.span.SetAttributes(outcomeAttr.String(outcome))
	if reason != "" {
		it.span.SetStatus(codes.Error, reason)
	}
	it.span.End()
	it.span = nil
}

// retried marks on it's span an attempt that could not move it for now.
func (it *item) retried(err error) {
	if it.span != nil && err != nil {
		it.span.AddEvent("retry", trace.WithAttributes(attribute.String("relayd.reason", err.Error())))
	}
}

// outcomeAttr is the attribute of a backfill span: what became of the
// message.
const outcomeAttr = attribute.Key("relayd.outcome")
