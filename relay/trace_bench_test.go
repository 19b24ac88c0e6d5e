package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

type nopSink struct{ target Target }

func (s nopSink) Target() Target                               { return s.target }
func (s nopSink) Ready() error                                 { return nil }
func (s nopSink) Publish(context.Context, []*Message, []error) {}

// A batch of 500 rows, each with a traceparent, published to both targets
// by a relay with tracing off, on with every row unsampled, and on with
// every row sampled (spans to an in-memory recorder).
func BenchmarkPublishTracing(b *testing.B) {
	rec := tracetest.NewSpanRecorder()
	on := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer on.Shutdown(context.Background())
	for _, bc := range []struct {
		name string
		tp   trace.TracerProvider
		tp0  string
	}{
		{"off", nil, sampledParent},
		{"on-unsampled", on, unsampledParent},
		{"on-sampled", on, sampledParent},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r, err := New(nil, Config{Sinks: []Sink{nopSink{TargetAMQP}, nopSink{TargetNATS}}, TracerProvider: bc.tp})
			if err != nil {
				b.Fatal(err)
			}
			rows := make([]*claimed, 500)
			for i := range rows {
				rows[i] = &claimed{msg: Message{ID: int64(i), MessageID: fmt.Sprint(i), Topic: "orders.created",
					Headers: map[string]string{"traceparent": bc.tp0, "content-type": "application/json"}, CreatedAt: time.Now()}}
				rows[i].want = perTarget[bool]{AMQP: true, NATS: true}
			}
			b.ReportAllocs()
			for b.Loop() {
				bt := r.tracer.startBatch(rows, time.Now(), time.Now())
				r.publish(context.Background(), rows, r.phase.now(), bt)
				rec.Reset()
			}
		})
	}
}
