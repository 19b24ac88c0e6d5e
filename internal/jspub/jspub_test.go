package jspub

import (
	"context"
	"errors"
	"strings"
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
	srv, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
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
