package testenv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream is a JetStream stream of a test's own, on a connection of its own.
type Stream struct {
	NC     *natsgo.Conn
	JS     jetstream.JetStream
	Stream jetstream.Stream
	Name   string // the stream's name
	Prefix string // it captures Prefix + ">"; Prefix ends with a dot
}

// NewStream connects to NATS and creates a stream capturing subjects under a
// fresh prefix; the stream is deleted and the connection closed when the
// test ends.
func NewStream(t testing.TB, prefix string) *Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := natsgo.Connect(NATSURL(t))
	if err != nil {
		t.Fatalf("connect to nats: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := Name(prefix)
	s := &Stream{NC: nc, JS: js, Name: strings.ToUpper(id), Prefix: id + "."}
	s.Stream = CreateStream(t, ctx, js, jetstream.StreamConfig{Name: s.Name, Subjects: []string{s.Prefix + ">"}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		js.DeleteStream(ctx, s.Name) //nolint:errcheck // best effort: the name is the test's own
	})
	return s
}

// errCodeStoreCreate is JetStream's "error creating store for stream".
const errCodeStoreCreate = 10049

// CreateStream creates a stream, trying again (up to 5 times, 100 ms apart)
// when the server fails to create its store. nats-server 2.9 removes an
// account's stream directory when its last file-stored stream is deleted;
// a stream created at that moment, by another test on the shared server,
// fails with "could not create storage directory" (10049). Nothing about
// the stream is wrong: the same create succeeds a moment later.
func CreateStream(t testing.TB, ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	for attempt := 1; ; attempt++ {
		s, err := js.CreateStream(ctx, cfg)
		if err == nil {
			return s
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStoreCreate || attempt == 5 {
			t.Fatalf("create stream %s: %v", cfg.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NATSServer runs a NATS server of the test's own, embedded, with opts — on
// 127.0.0.1 and a free port unless opts say, without signal handlers or
// logs — and shuts it down when the test ends. The test may stop it before
// (an outage) and start another on the same port and store directory.
func NATSServer(t testing.TB, opts *natsserver.Options) *natsserver.Server {
	t.Helper()
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port == 0 {
		opts.Port = natsserver.RANDOM_PORT // 0 would be 4222, the shared server's
	}
	opts.NoSigs, opts.NoLog = true, true
	s, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	return s
}
