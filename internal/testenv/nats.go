package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

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
	if s.Stream, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: s.Name, Subjects: []string{s.Prefix + ">"}}); err != nil {
		t.Fatalf("create stream %s: %v", s.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		js.DeleteStream(ctx, s.Name) //nolint:errcheck // best effort: the name is the test's own
	})
	return s
}
