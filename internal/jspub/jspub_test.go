package jspub

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
)

// parseAck reads the two forms of a stored message's PubAck as they are,
// and everything else as JSON, with the same answers encoding/json gives.
func TestParseAck(t *testing.T) {
	noResp := &nats.Msg{Header: nats.Header{"Status": []string{"503"}}}
	for _, stream := range []string{"RELAY", `A"B<C`} {
		s := New(nil, stream, 1, time.Second)
		q := string(s.ackStored[len(`{"stream":`) : len(s.ackStored)-len(`,`)])
		for _, c := range []struct {
			data    string
			dup     bool
			wantErr error
			code    jetstream.ErrorCode
		}{
			{data: `{"stream":` + q + `,"seq":1}`},
			{data: `{"stream":` + q + `, "seq":1}`},
			{data: `{"stream":` + q + `, "seq":1,"duplicate": true}`, dup: true},
			{data: `{"stream":` + q + `,"seq":1,"duplicate": true}`, dup: true},
			{data: `{"stream":` + q + `,  "seq":1}`},
			{data: `{"stream":` + q + `,"seq":}`, wantErr: jetstream.ErrInvalidJSAck},
			{data: `{"stream":` + q + `,"seq":18446744073709551615}`},
			{data: `{"stream":` + q + `,"seq":7,"duplicate":true}`, dup: true},
			{data: `{"stream":` + q + `,"seq":7,"domain":"hub","duplicate":true}`, dup: true},
			{data: `{"stream":` + q + `,"domain":"hub","seq":7}`},
			{data: `{"seq":7,"stream":` + q + `}`},
			{data: `{ "stream":` + q + `, "seq":7, "duplicate":true }`, dup: true},
			{data: `{"stream":` + q + `,"seq":7,"duplicate":false}`},
			{data: `{"stream":` + q + `,"seq":,"duplicate":true}`, wantErr: jetstream.ErrInvalidJSAck},
			{data: `{"stream":` + q + `,"seq":7}x`, wantErr: jetstream.ErrInvalidJSAck},
			{data: `{"seq":7}`, wantErr: jetstream.ErrInvalidJSAck},
			{data: ``, wantErr: jetstream.ErrInvalidJSAck},
			{data: `{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"},"stream":` + q + `,"seq":0}`, code: 10060},
			{data: `{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, code: 10077},
		} {
			dup, err := s.parseAck(&nats.Msg{Data: []byte(c.data)})
			var apiErr *jetstream.APIError
			switch {
			case c.code != 0:
				if !errors.As(err, &apiErr) || apiErr.ErrorCode != c.code {
					t.Errorf("%s: error %v, want API error %d", c.data, err, c.code)
				}
			case c.wantErr != nil:
				if !errors.Is(err, c.wantErr) {
					t.Errorf("%s: error %v, want %v", c.data, err, c.wantErr)
				}
			case err != nil || dup != c.dup:
				t.Errorf("%s: duplicate %v, error %v; want %v, nil", c.data, dup, err, c.dup)
			}
		}
		if _, err := s.parseAck(noResp); !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("no-responders status: error %v, want nats.ErrNoResponders", err)
		}
	}
}

// The PubAcks servers really send, stored and repeated, take the fast path
// (storedAck): the shared server (the version the project runs) and the
// embedded one (the module's, a later version).
func TestServersPubAcksAreReadWithoutJSON(t *testing.T) {
	srv := startServer(t)
	for name, url := range map[string]string{"shared": testenv.NATSURL(t), "embedded": srv.ClientURL()} {
		t.Run(name, func(t *testing.T) {
			nc, err := nats.Connect(url)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream := strings.ToUpper(testenv.Name("ackform"))
			testenv.CreateStream(t, ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
			defer js.DeleteStream(context.Background(), stream) //nolint:errcheck
			s := New(nc, stream, 1, time.Second)
			for i, wantDup := range []bool{false, true} {
				m := nats.NewMsg(stream + ".x")
				m.Header.Set(jetstream.MsgIDHeader, "one")
				m.Header.Set(jetstream.ExpectedStreamHeader, stream)
				r, err := nc.RequestMsg(m, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if dup, ok := s.storedAck(r.Data); !ok || dup != wantDup {
					t.Errorf("publish %d: PubAck %q read as duplicate %v, fast path %v; want %v, true", i+1, r.Data, dup, ok, wantDup)
				}
			}
		})
	}
}

// Nothing a Publisher starts outlives the test: it starts no goroutine.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startServer runs a JetStream server of the test's own.
func startServer(t *testing.T) *natsserver.Server {
	t.Helper()
	return testenv.NATSServer(t, &natsserver.Options{JetStream: true, StoreDir: t.TempDir()})
}

// silent returns a connection to a server of the test's own with a stream
// on "stored.>", and a plain subscriber on "silent.>" (returned): a message
// published there reaches it and nobody answers.
func silent(t *testing.T) (*nats.Conn, *nats.Subscription) {
	t.Helper()
	srv := startServer(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync("silent.>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() }) //nolint:errcheck
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testenv.CreateStream(t, ctx, js, jetstream.StreamConfig{Name: "STORED", Subjects: []string{"stored.>"}})
	return nc, sub
}

// publishAll runs Publish in a goroutine and fails the test if it has not
// returned after limit.
func publishAll(t *testing.T, ctx context.Context, p *Publisher, msgs []*nats.Msg, limit time.Duration) []error {
	t.Helper()
	errs, dup := make([]error, len(msgs)), make([]bool, len(msgs))
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Publish(ctx, msgs, errs, dup)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("Publish of %d messages still running after %v", len(msgs), limit)
	}
	return errs
}

// The ack timeout bounds every publish, also when the batch is larger than
// the window and its ctx has no deadline: the publishes that free the
// window by timing out let the rest go out, and those time out in turn.
func TestAckTimeoutWithAFullWindowAndNoDeadline(t *testing.T) {
	nc, _ := silent(t)
	p := New(nc, "STORED", 4, 200*time.Millisecond)
	msgs := make([]*nats.Msg, 10)
	for i := range msgs {
		msgs[i] = nats.NewMsg("silent.x")
	}
	start := time.Now()
	errs := publishAll(t, context.Background(), p, msgs, 10*time.Second)
	for i, err := range errs {
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Errorf("message %d: error %v, want jetstream.ErrAsyncPublishTimeout", i, err)
		}
	}
	// Three rounds of the window, each waiting the timeout.
	if took := time.Since(start); took < 550*time.Millisecond {
		t.Errorf("Publish took %v: a publish timed out before it waited 200ms", took)
	}
}

// The ack timeout counts from each message's publish, not from the batch's
// start or the timer's last setting: with a window of 1, the second message
// goes out when the first is answered, 150 ms in, and waits its whole
// 300 ms for a PubAck that never comes.
func TestAckTimeoutCountsFromEachPublish(t *testing.T) {
	nc, _ := silent(t)
	slow, err := nc.Subscribe("slow.>", func(m *nats.Msg) {
		time.Sleep(150 * time.Millisecond)
		m.Respond([]byte(`{"stream":"STORED", "seq":1}`)) //nolint:errcheck
	})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Unsubscribe() //nolint:errcheck
	p := New(nc, "STORED", 1, 300*time.Millisecond)
	msgs := []*nats.Msg{nats.NewMsg("slow.a"), nats.NewMsg("silent.b")}
	start := time.Now()
	errs := publishAll(t, context.Background(), p, msgs, 10*time.Second)
	took := time.Since(start)
	if errs[0] != nil {
		t.Errorf("message answered after 150ms: error %v, want nil", errs[0])
	}
	if !errors.Is(errs[1], jetstream.ErrAsyncPublishTimeout) {
		t.Errorf("silent message: error %v, want jetstream.ErrAsyncPublishTimeout", errs[1])
	}
	if took < 440*time.Millisecond {
		t.Errorf("Publish took %v: the second message, out at 150ms, did not get its own 300ms", took)
	}
}

// A ctx that is done stops the publishing: what was not published yet is
// not, and what waits for its PubAck fails, without waiting for the ack
// timeout.
func TestDoneCtxStopsTheBatch(t *testing.T) {
	nc, sub := silent(t)
	p := New(nc, "STORED", 2, time.Minute)
	msgs := make([]*nats.Msg, 5)
	for i := range msgs {
		msgs[i] = nats.NewMsg("silent.x")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errs := publishAll(t, ctx, p, msgs, 10*time.Second)
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("message %d: error %v, want it to wrap context.DeadlineExceeded", i, err)
		}
	}
	for i := 3; i < 5; i++ {
		if !strings.Contains(errs[i].Error(), "not published") {
			t.Errorf("message %d: error %v, want \"not published\"", i, errs[i])
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The window's two, and the third that waited for room in vain.
	if n, _, _ := sub.Pending(); n != 2 {
		t.Errorf("%d messages went out, want the window's 2", n)
	}
	if got := len(p.window); got != 0 {
		t.Errorf("%d window slots still taken after the batch", got)
	}
}

// A lookup asks once per subject, and not again in the batch after
// JetStream failed to answer one: here a responder that is not JetStream
// answers with an error.
func TestLookupStopsAskingWhenJetStreamDoesNotAnswer(t *testing.T) {
	nc, _ := silent(t)
	var asked atomic.Int64
	// A client whose JetStream API is under a prefix that a plain
	// responder answers with an error, as a server without JetStream does.
	other, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	js, err := jetstream.NewWithAPIPrefix(other, "$FAKE.API")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.Subscribe("$FAKE.API.STREAM.NAMES", func(m *nats.Msg) {
		asked.Add(1)
		m.Respond([]byte(`{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled"}}`)) //nolint:errcheck
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	l := NewLookup(js)
	for _, subject := range []string{"a.x", "a.x", "b.y", "c.z"} {
		if l.NoStream(context.Background(), subject) {
			t.Errorf("NoStream(%q) = true, want false: JetStream did not say", subject)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("asked %d times, want 1", n)
	}

	// Against the real API: once per subject.
	real, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	l = NewLookup(real)
	for _, c := range []struct {
		subject string
		none    bool
	}{{"stored.a", false}, {"nowhere.a", true}, {"nowhere.a", true}} {
		if got := l.NoStream(context.Background(), c.subject); got != c.none {
			t.Errorf("NoStream(%q) = %v, want %v", c.subject, got, c.none)
		}
	}
}
