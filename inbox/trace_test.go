package inbox

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The consumer's span hangs under the span whose traceparent the message
// carries, whichever broker it came from; without one, under ctx's span.
func TestStartSpan(t *testing.T) {
	const (
		relayTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		relaySpan  = "00f067aa0ba902b7"
		tp         = "00-" + relayTrace + "-" + relaySpan + "-01"
	)
	rec := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer provider.Shutdown(context.Background())
	tracer := provider.Tracer("test")
	outerCtx, outer := tracer.Start(context.Background(), "outer")
	defer outer.End()

	for _, tc := range []struct {
		name       string
		m          Message
		wantTrace  string
		wantParent string
		system     string
	}{
		{"amqp", AMQPMessage(amqp.Delivery{MessageId: "m-1", RoutingKey: "orders.created", Headers: amqp.Table{"traceparent": tp}}),
			relayTrace, relaySpan, "rabbitmq"},
		{"nats", Message{ID: "m-1", Source: SourceNATS, Subject: "app.orders.created", Headers: map[string]string{"traceparent": tp, "Nats-Msg-Id": "m-1"}},
			relayTrace, relaySpan, "nats"},
		{"no traceparent", Message{ID: "m-2", Source: SourceNATS, Subject: "app.orders.created"},
			outer.SpanContext().TraceID().String(), outer.SpanContext().SpanID().String(), "nats"},
		{"malformed", Message{ID: "m-3", Source: SourceAMQP, Subject: "orders.created", Headers: map[string]string{"traceparent": "00-zz-01"}},
			outer.SpanContext().TraceID().String(), outer.SpanContext().SpanID().String(), "rabbitmq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, span := StartSpan(outerCtx, tracer, tc.m)
			span.End()
			got := rec.Ended()[len(rec.Ended())-1]
			if got.SpanContext().TraceID().String() != tc.wantTrace || got.Parent().SpanID().String() != tc.wantParent {
				t.Errorf("span in trace %s under %s, want %s under %s", got.SpanContext().TraceID(), got.Parent().SpanID(), tc.wantTrace, tc.wantParent)
			}
			if got.SpanKind() != trace.SpanKindConsumer || got.Name() != "process "+tc.m.Subject {
				t.Errorf("span %q kind %v, want a consumer span \"process %s\"", got.Name(), got.SpanKind(), tc.m.Subject)
			}
			attrs := attribute.NewSet(got.Attributes()...)
			for k, want := range map[attribute.Key]string{"messaging.system": tc.system, "messaging.destination.name": tc.m.Subject,
				"messaging.message.id": tc.m.ID, "messaging.operation.type": "process"} {
				if v, _ := attrs.Value(k); v.AsString() != want {
					t.Errorf("%s = %q, want %q", k, v.AsString(), want)
				}
			}
		})
	}
}
