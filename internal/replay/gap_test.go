package replay

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// confirmAll is a Publisher RabbitMQ confirms everything on.
type confirmAll struct {
	mu  sync.Mutex
	ids []string
}

func (p *confirmAll) Publish(_ context.Context, msgs []*relay.Message, results []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range msgs {
		p.ids = append(p.ids, m.MessageID)
		results[i] = nil
	}
}

// Sequences of the window gone from the stream (purged, deleted, removed by
// its limits) can never reach RabbitMQ: the run still finishes, but says
// how many, rather than look like a complete replay.
func TestReplayCountsSequencesGoneFromTheStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	for _, tc := range []struct {
		name        string
		req         Request
		purgeBelow  uint64   // 0: none
		deleted     []uint64 // of sequences 1..10
		wantSent    int64
		wantMissing int64
	}{
		{"none gone", Request{FromSeq: 1}, 0, nil, 10, 0},
		{"the head purged, inner and last ones deleted", Request{FromSeq: 1}, 3, []uint64{5, 6, 10}, 5, 5},
		{"only the tail of a --to-seq window", Request{FromSeq: 2, ToSeq: 8}, 0, []uint64{7, 8}, 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) { // one at a time: one replay of a table runs at once
			s := testenv.NewStream(t, "replaygap")
			for i := 1; i <= 10; i++ {
				m := &nats.Msg{Subject: s.Prefix + "orders.a", Data: []byte("x"), Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprintf("m-%02d", i)}}}
				if _, err := s.JS.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			if tc.purgeBelow > 0 {
				if err := s.Stream.Purge(ctx, jetstream.WithPurgeSequence(tc.purgeBelow)); err != nil {
					t.Fatal(err)
				}
			}
			for _, seq := range tc.deleted {
				if err := s.Stream.DeleteMsg(ctx, seq); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := pool.Exec(ctx, `DELETE FROM `+table.Side("replay")); err != nil {
				t.Fatal(err)
			}
			var logged strings.Builder
			sink := &confirmAll{}
			sum, err := Run(ctx, Config{DB: pool, Table: table, JS: s.JS, Stream: s.Name, SubjectPrefix: s.Prefix,
				Sink: sink, Exchange: "x", Request: tc.req, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, logged.String())
			}
			if !sum.Finished || sum.Sent != tc.wantSent || sum.Missing != tc.wantMissing {
				t.Errorf("finished %v, %d sent, %d missing; want finished, %d sent, %d missing", sum.Finished, sum.Sent, sum.Missing, tc.wantSent, tc.wantMissing)
			}
			if said := strings.Contains(logged.String(), "not in the stream"); said != (tc.wantMissing > 0) {
				t.Errorf("warned of missing sequences: %v, want %v:\n%s", said, tc.wantMissing > 0, logged.String())
			}
		})
	}
}
