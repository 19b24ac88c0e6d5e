package relay

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/relayd/relayd/internal/outboxsql"
)

// tracerName is the instrumentation scope of the relay's spans.
const tracerName = "github.com/relayd/relayd/relay"

// traceParentHeader is the W3C header a row's producer context comes in.
const traceParentHeader = "traceparent"

// attemptKey is the attribute of a send span: which attempt this is, 1 for
// the first.
const attemptKey = attribute.Key("relayd.attempt")

// outcomeKey is the attribute of a send span: what the relay records.
const outcomeKey = attribute.Key("relayd.outcome")

// tracer starts the relay's spans; nil when tracing is off, and then no
// row's headers are looked at.
type tracer struct {
	tr     trace.Tracer
	dest   perTarget[func(m *Message) string]
	system perTarget[attribute.KeyValue]
	table  string
}

func newTracer(tp trace.TracerProvider, sinks []Sink, table string) *tracer {
	if tp == nil {
		return nil
	}
	t := &tracer{tr: tp.Tracer(tracerName), table: table,
		system: perTarget[attribute.KeyValue]{AMQP: semconv.MessagingSystemRabbitMQ, NATS: semconv.MessagingSystemKey.String("nats")}}
	for _, s := range sinks {
		if d, ok := s.(Destinationer); ok {
			t.dest.Set(s.Target(), d.Destination)
		}
	}
	return t
}

// destination names where tg publishes m.
func (t *tracer) destination(tg Target, m *Message) string {
	if f := t.dest.Get(tg); f != nil {
		return f(m)
	}
	return m.Topic
}

// sendSpan is one row's publish to one target, traced.
type sendSpan struct {
	span trace.Span
	msg  *Message // the row's message with the span's traceparent
}

// batchTrace is a batch's send spans, by row and target. A nil *batchTrace
// (tracing off, or no row of the batch traced) does nothing.
type batchTrace struct {
	t     *tracer
	rows  []perTarget[*sendSpan]
	links []trace.Link
}

// startBatch starts a send span for each row and wanted target whose
// producer context the sampler keeps, and a claim span linked to them. It
// returns nil when there are none.
func (t *tracer) startBatch(rows []*claimed, claimStart, claimedAt time.Time) *batchTrace {
	if t == nil {
		return nil
	}
	var b *batchTrace
	for i, c := range rows {
		if c.badRow != "" {
			continue
		}
		ctx, ok := producerContext(c.msg.Headers)
		if !ok {
			continue
		}
		for _, tg := range Targets {
			if !c.want.Get(tg) {
				continue
			}
			s := t.startSend(ctx, c, tg, claimedAt)
			if s == nil {
				break // the sampler's verdict is the trace's: the same for each target
			}
			if b == nil {
				b = &batchTrace{t: t, rows: make([]perTarget[*sendSpan], len(rows))}
			}
			b.rows[i].Set(tg, s)
			b.links = append(b.links, trace.Link{SpanContext: s.span.SpanContext()})
		}
	}
	if b != nil {
		_, span := t.tr.Start(context.Background(), "outbox claim", trace.WithTimestamp(claimStart),
			trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(b.links...), trace.WithAttributes(t.batchAttrs(len(rows))...))
		span.End(trace.WithTimestamp(claimedAt))
	}
	return b
}

func (t *tracer) batchAttrs(rows int) []attribute.KeyValue {
	return []attribute.KeyValue{semconv.DBSystemNamePostgreSQL, semconv.DBCollectionName(t.table),
		attribute.Int("relayd.batch.rows", rows)}
}

// producerContext is the producer's context in headers' traceparent (and
// tracestate); ok is false, with nothing else parsed, when there is no
// traceparent, and false when it is malformed.
func producerContext(h map[string]string) (ctx context.Context, ok bool) {
	if _, ok := h[traceParentHeader]; !ok {
		return nil, false
	}
	ctx = propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(h))
	return ctx, trace.SpanContextFromContext(ctx).IsValid()
}

// startSend starts the span of c's publish to target tg, a child of the
// producer's context ctx, at the row's created_at so that its time in the
// outbox shows. It returns nil when the sampler drops the span: the row
// goes as it is.
func (t *tracer) startSend(ctx context.Context, c *claimed, tg Target, claimedAt time.Time) *sendSpan {
	m := &c.msg
	_, span := t.tr.Start(ctx, "send "+m.Topic, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(m.CreatedAt))
	if !span.SpanContext().IsSampled() {
		span.End()
		return nil
	}
	span.SetAttributes(
		t.system.Get(tg),
		semconv.MessagingDestinationName(t.destination(tg, m)),
		semconv.MessagingMessageID(m.MessageID),
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		attemptKey.Int(int(c.attempts.Get(tg))+1),
	)
	if tg == TargetAMQP {
		key := m.Topic
		if m.Route != nil {
			key = m.Route.RoutingKey
		}
		span.SetAttributes(semconv.MessagingRabbitMQDestinationRoutingKey(key))
	}
	span.AddEvent("claimed", trace.WithTimestamp(claimedAt))
	out := *m
	out.Headers = withTraceContext(m.Headers, span.SpanContext())
	return &sendSpan{span: span, msg: &out}
}

// withTraceContext is a copy of h with sc as its traceparent (and
// tracestate, when sc has one; otherwise h's tracestate stays).
func withTraceContext(h map[string]string, sc trace.SpanContext) map[string]string {
	out := make(map[string]string, len(h)+1)
	for k, v := range h {
		out[k] = v
	}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.MapCarrier(out))
	return out
}

// message is what row i goes to target tg as: with its send span's
// traceparent when it is traced.
func (b *batchTrace) message(i int, tg Target, c *claimed) *Message {
	if b != nil {
		if s := b.rows[i].Get(tg); s != nil {
			return s.msg
		}
	}
	return &c.msg
}

// sent marks the moment target tg's messages went to its sink.
func (b *batchTrace) sent(tg Target, at time.Time) {
	if b == nil {
		return
	}
	for _, r := range b.rows {
		if s := r.Get(tg); s != nil {
			s.span.AddEvent("published", trace.WithTimestamp(at))
		}
	}
}

// end ends row i's send span on tg, if any, at done (when the broker
// answered), with the outcome recorded and, unless delivered, an error
// status with the reason.
func (b *batchTrace) end(i int, tg Target, outcome outboxsql.Outcome, errText string, err error, done time.Time) {
	if b == nil {
		return
	}
	s := b.rows[i].Get(tg)
	if s == nil {
		return
	}
	s.span.SetAttributes(outcomeKey.String(outcomeName(outcome)))
	if outcome != outcomeDelivered {
		s.span.SetAttributes(semconv.ErrorTypeKey.String(errorType(outcome, err)))
		s.span.SetStatus(codes.Error, errText)
	}
	s.span.End(trace.WithTimestamp(done))
}

// record traces the batch's record: a span linked to its send spans.
func (b *batchTrace) record(rows int, f func() error) error {
	if b == nil {
		return f()
	}
	_, span := b.t.tr.Start(context.Background(), "outbox record", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithLinks(b.links...), trace.WithAttributes(b.t.batchAttrs(rows)...))
	err := f()
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

func outcomeName(o outboxsql.Outcome) string {
	switch o {
	case outcomeDelivered:
		return "delivered"
	case outcomeRetry:
		return "retry"
	case outcomeParked:
		return "parked"
	case outcomeOutage:
		return "outage"
	}
	return "none"
}

// errorType is the span's error.type: a short class, not the message.
func errorType(outcome outboxsql.Outcome, err error) string {
	switch {
	case outcome == outcomeParked:
		return "parked"
	case errors.Is(err, ErrOutOfRoom):
		return "out_of_room"
	case errors.Is(err, ErrNoDestination):
		return "no_destination"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	}
	return "rejected"
}
