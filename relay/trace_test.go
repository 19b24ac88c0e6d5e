package relay

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

const (
	sampledParent   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	unsampledParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	producerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
)

// newTestTracer is a tracer over an in-memory provider with the SDK's
// default sampler (parent-based, always on) and what it recorded.
func newTestTracer(t *testing.T) (*tracer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return newTracer(tp, nil, "outbox"), rec
}

// A row is traced only when its traceparent is well formed and sampled;
// the header its target gets is then the send span's, the rest as it was.
// Otherwise nothing is started and the row goes as it is.
func TestSendSpanHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string]string
		traced  bool
	}{
		{"sampled", map[string]string{"traceparent": sampledParent, "tracestate": "vendor=x", "content-type": "application/json"}, true},
		{"sampled without tracestate", map[string]string{"traceparent": sampledParent}, true},
		{"unsampled", map[string]string{"traceparent": unsampledParent, "tracestate": "vendor=x"}, false},
		{"malformed", map[string]string{"traceparent": "00-nothex-00f067aa0ba902b7-01"}, false},
		{"all-zero trace id", map[string]string{"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, false},
		{"absent", map[string]string{"content-type": "text/plain"}, false},
		{"no headers", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, rec := newTestTracer(t)
			orig := maps.Clone(tc.headers)
			c := &claimed{msg: Message{ID: 1, MessageID: "m-1", Topic: "orders.created", Headers: tc.headers, CreatedAt: time.Now().Add(-time.Minute)}}
			c.want.Set(TargetNATS, true)
			b := tr.startBatch([]*claimed{c}, time.Now(), time.Now())
			if !maps.Equal(c.msg.Headers, orig) {
				t.Fatalf("row's own headers changed: %v, want %v", c.msg.Headers, orig)
			}
			got := b.message(0, TargetNATS, c)
			if !tc.traced {
				if b != nil || got != &c.msg || len(rec.Started()) != 0 {
					t.Fatalf("untraced row: batch %v, message rewritten %v, %d spans started; want none", b, got != &c.msg, len(rec.Started()))
				}
				return
			}
			if b == nil {
				t.Fatal("sampled row not traced")
			}
			b.end(0, TargetNATS, outcomeDelivered, "", nil, time.Now())
			var send sdktrace.ReadOnlySpan
			for _, s := range rec.Ended() {
				if strings.HasPrefix(s.Name(), "send ") {
					send = s
				}
			}
			if send == nil {
				t.Fatalf("no send span among %d ended", len(rec.Ended()))
			}
			sc := send.SpanContext()
			want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
			if sc.TraceID().String() != producerTraceID || send.Parent().SpanID().String() != "00f067aa0ba902b7" {
				t.Errorf("span trace %s parent %s; want the producer's", sc.TraceID(), send.Parent().SpanID())
			}
			if got.Headers["traceparent"] != want {
				t.Errorf("traceparent %q, want the send span's %q", got.Headers["traceparent"], want)
			}
			for k, v := range orig {
				if k != "traceparent" && got.Headers[k] != v {
					t.Errorf("header %s = %q, want %q passed through", k, got.Headers[k], v)
				}
			}
			if len(got.Headers) != len(orig) {
				t.Errorf("headers %v: want only traceparent changed from %v", got.Headers, orig)
			}
			if !send.StartTime().Equal(c.msg.CreatedAt) {
				t.Errorf("span starts %v, want the row's created_at %v", send.StartTime(), c.msg.CreatedAt)
			}
		})
	}
}

// capturingSink records the messages it is given and answers with fail.
type capturingSink struct {
	target Target
	fail   func(*Message) error
	mu     sync.Mutex
	got    []*Message
}

func (s *capturingSink) Target() Target { return s.target }
func (s *capturingSink) Ready() error   { return nil }
func (s *capturingSink) Publish(_ context.Context, msgs []*Message, results []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range msgs {
		s.got = append(s.got, m)
		if s.fail != nil {
			results[i] = s.fail(m)
		}
	}
}

// Each target gets its own send span's traceparent; a parked row's span has
// an error status with the reason, and the batch's claim and record spans
// link to the send spans rather than parent them.
func TestPublishTracesEachTarget(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	amqpSink := &capturingSink{target: TargetAMQP}
	natsSink := &capturingSink{target: TargetNATS, fail: func(*Message) error { return Permanent("no stream") }}
	r, err := New(nil, Config{Sinks: []Sink{amqpSink, natsSink}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	c := &claimed{msg: Message{ID: 1, MessageID: "m-1", Topic: "orders.created", Headers: map[string]string{"traceparent": sampledParent}, CreatedAt: time.Now()}}
	c.want = perTarget[bool]{AMQP: true, NATS: true}
	c.attempts.AMQP = 2
	plain := &claimed{msg: Message{ID: 2, MessageID: "m-2", Topic: "orders.created", CreatedAt: time.Now()}}
	plain.want = perTarget[bool]{AMQP: true, NATS: true}
	rows := []*claimed{c, plain}
	bt := r.tracer.startBatch(rows, time.Now(), time.Now())
	r.publish(context.Background(), rows, r.phase.now(), bt)
	if err := bt.record(len(rows), func() error { return nil }); err != nil {
		t.Fatal(err)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		key := s.Name()
		for _, a := range s.Attributes() {
			if a.Key == "messaging.system" {
				key = a.Value.AsString()
			}
		}
		spans[key] = s
	}
	if len(spans) != 4 {
		t.Fatalf("spans %v; want a send span per target, a claim and a record", keys(spans))
	}
	for _, s := range []*capturingSink{amqpSink, natsSink} {
		sys := map[Target]string{TargetAMQP: "rabbitmq", TargetNATS: "nats"}[s.target]
		span := spans[sys]
		want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
		if len(s.got) != 2 || s.got[0].Headers["traceparent"] != want || s.got[1].Headers != nil {
			t.Errorf("%s got %d messages, traced one's traceparent %q; want 2, %q, the other untouched", s.target, len(s.got), s.got[0].Headers["traceparent"], want)
		}
	}
	if st := spans["rabbitmq"].Status(); st.Code != codes.Unset {
		t.Errorf("delivered span status %v, want unset", st)
	}
	if v := attr(spans["rabbitmq"], "relayd.attempt"); v.AsInt64() != 3 {
		t.Errorf("relayd.attempt %v, want 3 (two failed before)", v.String())
	}
	if st := spans["nats"].Status(); st.Code != codes.Error || !strings.Contains(st.Description, "no stream") {
		t.Errorf("parked span status %+v, want an error with the reason", st)
	}
	for _, name := range []string{"outbox claim", "outbox record"} {
		s := spans[name]
		if s == nil || s.Parent().IsValid() || len(s.Links()) != 2 {
			t.Fatalf("%s: %v; want a root span linked to the 2 send spans", name, s)
		}
	}
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// With tracing off the relay has no tracer, and a batch no trace: nothing
// reads the rows' headers.
func TestTracingOffDoesNothing(t *testing.T) {
	r, err := New(nil, Config{Sinks: []Sink{&capturingSink{target: TargetAMQP}}})
	if err != nil {
		t.Fatal(err)
	}
	c := &claimed{msg: Message{Headers: map[string]string{"traceparent": sampledParent}}}
	c.want.AMQP = true
	if r.tracer != nil || r.tracer.startBatch([]*claimed{c}, time.Now(), time.Now()) != nil {
		t.Fatal("tracing off, yet a tracer or a batch trace")
	}
}
