package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// hookedSink confirms everything and calls at once, when it has been given
// at least after messages.
type hookedSink struct {
	confirmAll
	after int
	at    func()
	once  sync.Once
}

func (p *hookedSink) Publish(ctx context.Context, msgs []*relay.Message, results []error) {
	p.confirmAll.Publish(ctx, msgs, results)
	p.mu.Lock()
	n := len(p.ids)
	p.mu.Unlock()
	if n >= p.after {
		p.once.Do(p.at)
	}
}

// A stream deleted, or deleted and re-created under its name, while a
// replay reads it: the run stops at once with the position it confirmed,
// names the stream and what to do, and never reads the new stream's
// sequences as the window's; a rerun refuses to resume on another stream,
// and --restart starts a run over the new one.
func TestReplayStopsWhenItsStreamGoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	const n = 2000
	for _, tc := range []struct {
		name     string
		recreate bool
		want     string // in the error
	}{
		{"deleted", false, "does not exist"},
		{"re-created", true, "was re-created"},
	} {
		t.Run(tc.name, func(t *testing.T) { // one at a time: one replay of a table runs at once
			s := testenv.NewStream(t, "replaygone")
			publish := func(id string) {
				m := &nats.Msg{Subject: s.Prefix + "orders.a", Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: {id}}}
				if _, err := s.JS.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				publish(fmt.Sprintf("m-%04d", i))
			}
			if _, err := pool.Exec(ctx, `DELETE FROM `+table.Side("replay")); err != nil {
				t.Fatal(err)
			}
			cfg := func(sink Publisher, restart bool, logged *strings.Builder) Config {
				return Config{DB: pool, Table: table, JS: s.JS, Stream: s.Name, SubjectPrefix: s.Prefix,
					Sink: sink, Exchange: "x", Request: Request{FromSeq: 1}, Rate: 2000, Restart: restart,
					Logger: slog.New(slog.NewTextHandler(logged, nil))}
			}
			var goneAt time.Time
			sink := &hookedSink{after: 300, at: func() {
				goneAt = time.Now()
				if err := s.JS.DeleteStream(ctx, s.Name); err != nil {
					t.Error(err)
					return
				}
				if tc.recreate {
					s.Stream = testenv.CreateStream(t, ctx, s.JS, jetstream.StreamConfig{Name: s.Name, Subjects: []string{s.Prefix + ">"}})
					for i := range n {
						publish(fmt.Sprintf("n-%04d", i))
					}
				}
			}}
			var logged strings.Builder
			sum, err := Run(ctx, cfg(sink, false, &logged))
			var gone *StreamGoneError
			var replaced *StreamReplacedError
			if as := errors.As(err, &replaced) || errors.As(err, &gone); !as || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), s.Name) {
				t.Fatalf("Run: %v, want an error naming %s that says it %s\n%s", err, s.Name, tc.want, logged.String())
			}
			if (replaced != nil) != tc.recreate {
				t.Errorf("Run: %v, want a StreamReplacedError: %v", err, tc.recreate)
			}
			if took := time.Since(goneAt); took > 20*time.Second {
				t.Errorf("the run stopped %s after the stream went, want within 20 s", took)
			}
			if sum.Finished || sum.Record.Position < 300 || sum.Record.Position >= n {
				t.Errorf("finished %v at %d, want unfinished between 300 and %d", sum.Finished, sum.Record.Position, n)
			}
			for _, id := range sink.ids {
				if strings.HasPrefix(id, "n-") {
					t.Fatalf("the replay sent %s, a message of the re-created stream", id)
				}
			}
			// A rerun resumes only on the stream the run read.
			logged.Reset()
			if _, err := Run(ctx, cfg(&confirmAll{}, false, &logged)); err == nil || !strings.Contains(err.Error(), s.Name) {
				t.Errorf("rerun: %v, want an error naming %s\n%s", err, s.Name, logged.String())
			}
			if !tc.recreate {
				return
			}
			again := &confirmAll{}
			sum, err = Run(ctx, cfg(again, true, &logged))
			if err != nil || !sum.Finished || len(again.ids) != n || !strings.HasPrefix(again.ids[0], "n-") {
				t.Errorf("--restart: %v, finished %v, sent %d (first %v); want the re-created stream's %d", err, sum.Finished, len(again.ids), again.ids[:min(1, len(again.ids))], n)
			}
		})
	}
}
