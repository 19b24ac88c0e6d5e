package replay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/errlog"
)

// quietMessages never yields a message, as a consumer whose pushed messages
// were lost with a connection does.
type quietMessages struct{ jetstream.MessagesContext }

func (quietMessages) Next(...jetstream.NextOpt) (jetstream.Msg, error) { return nil, nats.ErrTimeout }

// infoConsumer answers Info with ci, counting the calls.
type infoConsumer struct {
	jetstream.Consumer
	ci    jetstream.ConsumerInfo
	calls int
	stop  func()
}

func (c *infoConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	if c.calls++; c.calls == 3 {
		c.stop()
	}
	return &c.ci, nil
}

// createdStream is a stream created at created, all its Info says.
type createdStream struct {
	jetstream.Stream
	created time.Time
}

func (s createdStream) Info(context.Context, ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	return s.CachedInfo(), nil
}

func (s createdStream) CachedInfo() *jetstream.StreamInfo {
	return &jetstream.StreamInfo{Created: s.created}
}

// A consumer with nothing pending ends the window only once everything it
// delivered was read: what the server delivered past the last message read
// is on its way, or lost and asked for again; it is not gone.
func TestSourceEndsOnlyWhenNothingDeliveredIsUnread(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		delivered uint64 // the consumer's last delivered stream sequence
		wantDone  bool
	}{
		{"everything delivered was read", 4, true},
		{"sequences 5..7 delivered, not read", 7, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cons := &infoConsumer{stop: cancel}
			cons.ci.Delivered.Stream = tc.delivered
			var gone [][2]uint64
			s := &source{stream: createdStream{}, cons: cons, it: quietMessages{}, to: 10, expect: 5,
				gone: func(from, to uint64) { gone = append(gone, [2]uint64{from, to}) }, errs: errlog.New(nil, "test")}
			_, ok, err := s.next(ctx)
			if ok {
				t.Fatal("next returned a message")
			}
			if tc.wantDone {
				if err != nil || len(gone) != 1 || gone[0] != [2]uint64{5, 10} {
					t.Fatalf("next: %v, gone %v; want the window's end, 5..10 gone", err, gone)
				}
				return
			}
			if !errors.Is(err, context.Canceled) || len(gone) != 0 || s.done {
				t.Fatalf("next: %v, gone %v, done %v; want it still waiting when stopped, nothing gone", err, gone, s.done)
			}
		})
	}
}
