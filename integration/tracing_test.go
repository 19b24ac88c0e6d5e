package integration

import (
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// otlpReceiver is an OTLP/HTTP endpoint of the test's own: it decodes each
// export request and keeps the spans, with their resource's attributes.
type otlpReceiver struct {
	url string
	mu  sync.Mutex
	got []receivedSpan
}

type receivedSpan struct {
	*tracepb.Span
	resource map[string]string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want a protobuf POST to /v1/traces", http.StatusBadRequest)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		raw, err := io.ReadAll(body)
		var export collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(raw, &export)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			res := attrMap(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.got = append(r.got, receivedSpan{Span: s, resource: res})
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// spans returns the spans received so far of trace id (hex) whose name
// starts with prefix.
func (r *otlpReceiver) spans(traceID, prefix string) []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []receivedSpan
	for _, s := range r.got {
		if (traceID == "" || hex.EncodeToString(s.TraceId) == traceID) && strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = strconv.FormatInt(v.IntValue, 10)
		}
	}
	return m
}

// producerContext is a fresh W3C trace context of a producer's span.
func producerContext(t *testing.T, sampled bool) (traceID, spanID, traceparent string) {
	t.Helper()
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	traceID, spanID = hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	flags := "00"
	if sampled {
		flags = "01"
	}
	return traceID, spanID, "00-" + traceID + "-" + spanID + "-" + flags
}

// relayd with OTEL_EXPORTER_OTLP_ENDPOINT at the test's receiver: a row with
// a sampled traceparent yields one send span per target under the
// producer's trace, whose id is the traceparent each broker's copy carries;
// an unsampled row yields none and goes as it was written; a row parked on
// one target has an error status there with the reason.
func TestTracingSpansPerTarget(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	recv := newOTLPReceiver(t)
	p := e.startRelay("relay", "OTEL_EXPORTER_OTLP_ENDPOINT="+recv.url, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=relayd-it")
	ctx := context.Background()

	sampledTrace, producerSpan, sampledTP := producerContext(t, true)
	unsampledTrace, _, unsampledTP := producerContext(t, false)
	parkedTrace, _, parkedTP := producerContext(t, true)
	sampledID, unsampledID, parkedID := uuid.NewString(), uuid.NewString(), uuid.NewString()
	before := time.Now()
	if _, err := e.writer.Write(ctx, e.pool,
		outbox.Message{ID: unsampledID, Topic: "orders.untraced", Headers: map[string]string{"traceparent": unsampledTP}, Payload: []byte("u")},
		outbox.Message{ID: sampledID, Topic: "orders.traced", Headers: map[string]string{"traceparent": sampledTP, "tracestate": "vendor=x"}, Payload: []byte("s")},
	); err != nil {
		t.Fatal(err)
	}
	// A header key NATS refuses (the outbox package would refuse it too):
	// parked for nats, delivered to RabbitMQ. Written an hour ago: its
	// spans start then.
	parkedCreated := before.Add(-time.Hour).Truncate(time.Microsecond)
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.table.Ident()+` (message_id, topic, payload, headers, created_at) VALUES ($1, 'orders.parked', '\x00', $2, $3)`,
		parkedID, `{"traceparent": "`+parkedTP+`", "bad key": "1"}`, parkedCreated); err != nil {
		t.Fatal(err)
	}
	after := time.Now()

	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(recv.spans(sampledTrace, "send ")) >= 2 && len(recv.spans(parkedTrace, "send ")) >= 2
	}, "send spans not received: %d of the sampled row, %d of the parked one", len(recv.spans(sampledTrace, "send ")), len(recv.spans(parkedTrace, "send ")))
	testenv.Eventually(t, 30*time.Second, func() bool {
		var parked int
		e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table.Owed()+` WHERE nats_parked_at IS NOT NULL`).Scan(&parked)
		total, amqpN, natsN := e.counts()
		return total == 3 && amqpN == 3 && natsN == 2 && parked == 1
	}, "rows not delivered / parked row not parked on nats")
	// Stopped, relayd exports what it has left: had the unsampled row a
	// span, it would be in by now.
	if code := p.stop(30 * time.Second); code != 0 {
		t.Fatalf("relayd exit %d", code)
	}
	if s := recv.spans(unsampledTrace, ""); len(s) != 0 {
		t.Fatalf("unsampled row: %d spans (%s), want none", len(s), s[0].Name)
	}

	byTarget := func(traceID string) map[string]receivedSpan {
		out := map[string]receivedSpan{}
		for _, s := range recv.spans(traceID, "send ") {
			out[attrMap(s.Attributes)["messaging.system"]] = s
		}
		return out
	}
	sent := byTarget(sampledTrace)
	if len(recv.spans(sampledTrace, "send ")) != 2 || len(sent) != 2 {
		t.Fatalf("sampled row: %d send spans over %d systems, want one per target", len(recv.spans(sampledTrace, "send ")), len(sent))
	}
	wantDest := map[string]string{"rabbitmq": e.exchange, "nats": e.prefix + "orders.traced"}
	for sys, s := range sent {
		a := attrMap(s.Attributes)
		for k, want := range map[string]string{
			"messaging.destination.name": wantDest[sys], "messaging.message.id": sampledID,
			"messaging.operation.type": "send", "relayd.attempt": "1", "relayd.outcome": "delivered",
		} {
			if a[k] != want {
				t.Errorf("%s span: %s = %q, want %q", sys, k, a[k], want)
			}
		}
		if s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || hex.EncodeToString(s.ParentSpanId) != producerSpan {
			t.Errorf("%s span: kind %v parent %x; want a producer span under the producer's %s", sys, s.Kind, s.ParentSpanId, producerSpan)
		}
		if s.resource["service.name"] != "relayd-it" || s.resource["service.instance.id"] == "" {
			t.Errorf("%s span: resource %v; want service.name relayd-it and a service.instance.id", sys, s.resource)
		}
		start := time.Unix(0, int64(s.StartTimeUnixNano))
		if start.Before(before.Add(-time.Second)) || start.After(after) {
			t.Errorf("%s span starts %v, want the row's created_at, between %v and %v", sys, start, before, after)
		}
		published := eventTime(s, "published")
		if published.IsZero() || published.Before(start) || uint64(published.UnixNano()) > s.EndTimeUnixNano {
			t.Errorf("%s span: published event at %v, want between the start %v and the end", sys, published, start)
		}
		if s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("%s span: error status %q for a delivered row", sys, s.Status.Message)
		}
	}

	// What each broker got: the send span's traceparent (tracestate as
	// written), and the unsampled row's header as it was.
	natsHeaders := e.streamHeaders()
	amqpHeaders := e.queueHeaders(3)
	for sys, got := range map[string]map[string]map[string]string{"nats": natsHeaders, "rabbitmq": amqpHeaders} {
		s := sent[sys]
		want := "00-" + sampledTrace + "-" + hex.EncodeToString(s.SpanId) + "-01"
		if h := got[sampledID]; h["traceparent"] != want || h["tracestate"] != "vendor=x" {
			t.Errorf("%s copy of the sampled row: traceparent %q tracestate %q; want the relay span's %q and vendor=x", sys, h["traceparent"], h["tracestate"], want)
		}
		if h := got[unsampledID]; h["traceparent"] != unsampledTP {
			t.Errorf("%s copy of the unsampled row: traceparent %q, want it unchanged %q", sys, h["traceparent"], unsampledTP)
		}
	}
	if _, ok := natsHeaders[parkedID]; ok {
		t.Errorf("parked row reached JetStream")
	}

	parked := byTarget(parkedTrace)
	if s := parked["nats"]; s.Span == nil || s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR ||
		!strings.Contains(s.Status.Message, "bad key") || attrMap(s.Attributes)["relayd.outcome"] != "parked" {
		t.Errorf("parked row's nats span: %v; want an error status with the reason (the key) and outcome parked", s.Span)
	}
	if s := parked["rabbitmq"]; s.Span == nil || s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("parked row's rabbitmq span: %v; want one without error (RabbitMQ took it)", s.Span)
	}
	for sys, s := range parked {
		if start := time.Unix(0, int64(s.StartTimeUnixNano)); !start.Equal(parkedCreated) {
			t.Errorf("parked row's %s span starts %v, want its created_at %v", sys, start, parkedCreated)
		}
	}

	// The batch's claim and record: spans of their own, linked to the sends.
	for _, name := range []string{"outbox claim", "outbox record"} {
		if !linksTo(recv.spans("", name), sent["nats"].SpanId) {
			t.Errorf("no %q span linked to the sampled row's nats span", name)
		}
	}
}

func eventTime(s receivedSpan, name string) time.Time {
	for _, ev := range s.Events {
		if ev.Name == name {
			return time.Unix(0, int64(ev.TimeUnixNano))
		}
	}
	return time.Time{}
}

func linksTo(spans []receivedSpan, spanID []byte) bool {
	for _, s := range spans {
		if len(s.ParentSpanId) != 0 {
			continue
		}
		for _, l := range s.Links {
			if string(l.SpanId) == string(spanID) {
				return true
			}
		}
	}
	return false
}

// streamHeaders reads the test's stream whole: each message's headers by
// its Nats-Msg-Id.
func (e *env) streamHeaders() map[string]map[string]string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatalf("get message %d: %v", seq, err)
		}
		h := map[string]string{}
		for k := range m.Header {
			h[k] = m.Header.Get(k)
		}
		out[m.Header.Get(jetstream.MsgIDHeader)] = h
	}
	return out
}

// queueHeaders reads n messages from the test's queue: each one's string
// headers by its message-id.
func (e *env) queueHeaders(n int) map[string]map[string]string {
	e.t.Helper()
	ch, err := e.amqpConn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	deliveries, err := ch.Consume(e.queue, "", true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]map[string]string{}
	deadline := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case d := <-deliveries:
			h := map[string]string{}
			for k, v := range d.Headers {
				if s, ok := v.(string); ok {
					h[k] = s
				}
			}
			out[d.MessageId] = h
		case <-deadline:
			e.t.Fatalf("queue %s: %d of %d messages", e.queue, len(out), n)
		}
	}
	return out
}

// relayd backfill with tracing on: a moved message with a sampled
// traceparent has a span under the producer's, whose traceparent its
// JetStream copy carries; an unsampled one has none and moves as it was; one
// JetStream refuses has an error status with the reason. The spans are
// exported by the time the run exits.
func TestTracingBackfill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	recv := newOTLPReceiver(t)
	sampledTrace, producerSpan, sampledTP := producerContext(t, true)
	unsampledTrace, _, unsampledTP := producerContext(t, false)
	refusedTrace, _, refusedTP := producerContext(t, true)
	e.legacyPublish([]amqp.Publishing{
		{MessageId: "traced", Body: []byte("a"), Headers: amqp.Table{"traceparent": sampledTP, "tracestate": "vendor=x"}},
		{MessageId: "untraced", Body: []byte("b"), Headers: amqp.Table{"traceparent": unsampledTP}},
		{MessageId: "refused", Body: []byte("c"), Headers: amqp.Table{"traceparent": refusedTP, "Nats-Rollup": "sub"}},
	}, "orders.legacy")

	cmd := e.backfillCmd()
	cmd.Env = append(cmd.Env, "OTEL_EXPORTER_OTLP_ENDPOINT="+recv.url, "OTEL_SERVICE_NAME=relayd-backfill-it")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("backfill still running after 90s:\n%s", out)
	}
	if err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	if sum := decodeSummary(t, out); sum.Moved != 2 || sum.Failed != 1 {
		t.Fatalf("summary %+v: want 2 moved, 1 held\n%s", sum, out)
	}

	spans := recv.spans(sampledTrace, "send ")
	if len(spans) != 1 {
		t.Fatalf("moved message: %d spans, want 1 (exported before the run exited)", len(spans))
	}
	s := spans[0]
	a := attrMap(s.Attributes)
	for k, want := range map[string]string{"messaging.system": "nats", "messaging.destination.name": e.prefix + "orders.legacy",
		"messaging.message.id": "traced", "messaging.operation.type": "send", "relayd.outcome": "moved"} {
		if a[k] != want {
			t.Errorf("span: %s = %q, want %q", k, a[k], want)
		}
	}
	if hex.EncodeToString(s.ParentSpanId) != producerSpan || s.Kind != tracepb.Span_SPAN_KIND_PRODUCER {
		t.Errorf("span: kind %v parent %x, want a producer span under %s", s.Kind, s.ParentSpanId, producerSpan)
	}
	h := e.streamHeaders()
	if want := "00-" + sampledTrace + "-" + hex.EncodeToString(s.SpanId) + "-01"; h["traced"]["traceparent"] != want || h["traced"]["tracestate"] != "vendor=x" {
		t.Errorf("JetStream copy: traceparent %q tracestate %q, want %q and vendor=x", h["traced"]["traceparent"], h["traced"]["tracestate"], want)
	}
	if h["untraced"]["traceparent"] != unsampledTP || len(recv.spans(unsampledTrace, "")) != 0 {
		t.Errorf("unsampled message: traceparent %q, %d spans; want it unchanged and none", h["untraced"]["traceparent"], len(recv.spans(unsampledTrace, "")))
	}
	refused := recv.spans(refusedTrace, "send ")
	if len(refused) != 1 || refused[0].Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || !strings.Contains(refused[0].Status.Message, "Nats-Rollup") {
		t.Errorf("refused message: spans %v; want one with an error status giving the reason", refused)
	}
}
