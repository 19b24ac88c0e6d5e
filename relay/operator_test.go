package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/natssink"
)

// What an operator does to the stream while the relay runs parks no row:
// the relay says at once what is missing, waits (a missing stream uses up
// no attempt; a subject the stream does not capture counts attempts, as an
// unroutable AMQP message does), and once the operator's next change fixes
// it, every row is in the stream once. Real Postgres and JetStream.
func TestOperatorChangesToTheStreamParkNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		broken, fix  func(e *streamOps)
		wantLog      string
		wantAttempts bool // the rows count attempts meanwhile
	}{
		{
			name:    "the stream deleted, then created again",
			broken:  func(e *streamOps) { e.delete(e.name) },
			fix:     func(e *streamOps) { e.create(e.name, ">") },
			wantLog: "has no stream " + "%s",
		},
		{
			name:    "the stream deleted, another capturing its subjects",
			broken:  func(e *streamOps) { e.delete(e.name); e.create(e.name+"_NEW", ">") },
			fix:     func(e *streamOps) { e.delete(e.name + "_NEW"); e.create(e.name, ">") },
			wantLog: "has no stream " + "%s",
		},
		{
			name:         "the stream created again with narrower subjects, then widened",
			broken:       func(e *streamOps) { e.delete(e.name); e.create(e.name, "orders.kept") },
			fix:          func(e *streamOps) { e.update(e.name, ">") },
			wantLog:      "stream %s does not capture",
			wantAttempts: true,
		},
		{
			name:         "the subject moved to another stream, then back",
			broken:       func(e *streamOps) { e.update(e.name, "orders.kept"); e.create(e.name+"_OTHER", "orders.moved") },
			fix:          func(e *streamOps) { e.delete(e.name + "_OTHER"); e.update(e.name, ">") },
			wantLog:      "another stream captures it",
			wantAttempts: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newRelayFixture(t)
			st := testenv.NewStream(t, "ops")
			e := &streamOps{t: t, js: st.JS, name: st.Name, prefix: st.Prefix}
			t.Cleanup(func() { e.delete(e.name + "_NEW"); e.delete(e.name + "_OTHER") })
			var logged testenv.SyncBuffer
			sink, err := natssink.New(natssink.Config{Conn: st.NC, Stream: st.Name, SubjectPrefix: st.Prefix, AckTimeout: 5 * time.Second,
				Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatal(err)
			}
			r := f.start(relay.Config{Table: f.table, Sinks: []relay.Sink{sink}, MaxAttempts: 1000,
				PollInterval: 20 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
			warm := f.insert(1, "orders.kept")
			testenv.Eventually(t, 10*time.Second, func() bool { return f.done(warm...) }, "the first row never reached the stream")

			tc.broken(e)
			ids := f.insert(200, "orders.moved")
			want := tc.wantLog
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, st.Name)
			}
			testenv.Eventually(t, 2*time.Second, func() bool { return strings.Contains(logged.String(), want) },
				"no log line saying %q within 2 s:\n%s", want, &logged)
			testenv.Eventually(t, 10*time.Second, func() bool {
				s := f.stats(relay.TargetNATS)
				return s.Lag > 0 && s.Pending == int64(len(ids)) && s.Parked == 0
			}, "the lag never rose with the rows pending: %+v", f.stats(relay.TargetNATS))
			if !tc.wantAttempts {
				testenv.Eventually(t, 10*time.Second, func() bool {
					return strings.Contains(strings.Join(r.Unready(), "; "), "stream does not exist") && slices.Contains(r.Paused(), relay.TargetNATS)
				}, "/readyz never said the stream is missing, or the target never paused: %q", r.Unready())
			}
			testenv.Eventually(t, 10*time.Second, func() bool { return f.tried("nats", ids) }, "the rows were never tried")
			attempts := f.attempts("nats", ids)
			if tc.wantAttempts != (attempts > 0) {
				t.Errorf("rows' attempts meanwhile: %d, want some: %v", attempts, tc.wantAttempts)
			}

			tc.fix(e)
			testenv.Eventually(t, 30*time.Second, func() bool { return f.done(ids...) }, "the rows never reached the stream once it was fixed")
			testenv.Eventually(t, 10*time.Second, func() bool { return len(r.Paused()) == 0 }, "the target stayed paused: %q", r.Unready())
			if s := f.stats(relay.TargetNATS); s.Parked != 0 {
				t.Errorf("%d rows parked", s.Parked)
			}
			got := e.ids(e.name)
			for _, id := range ids {
				if got[id] != 1 {
					t.Fatalf("row %s is in stream %s %d times, want once", id, e.name, got[id])
				}
			}
		})
	}
}

// streamOps is what an operator does to one test's stream.
type streamOps struct {
	t            *testing.T
	js           jetstream.JetStream
	name, prefix string
}

// create makes stream name capturing prefix+subject.
func (e *streamOps) create(name, subject string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testenv.CreateStream(e.t, ctx, e.js, jetstream.StreamConfig{Name: name, Subjects: []string{e.prefix + subject}})
}

// update sets stream name's subjects to prefix+subject.
func (e *streamOps) update(name, subject string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.js.UpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{e.prefix + subject}}); err != nil {
		e.t.Fatalf("update stream %s: %v", name, err)
	}
}

// delete deletes stream name, if there is one.
func (e *streamOps) delete(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.js.DeleteStream(ctx, name) //nolint:errcheck // the test's own names; gone already is fine
}

// ids counts the messages of stream name by Nats-Msg-Id.
func (e *streamOps) ids(name string) map[string]int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	got := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatalf("stream %s, sequence %d: %v", name, seq, err)
		}
		got[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	return got
}

// The relay's NATS user loses its publish permission on the stream's
// subjects, then gets it back (a private server, its options reloaded):
// the server's refusal is named in the log at once, the target pauses
// without using up attempts or parking, and every row is in the stream
// once after the permission is restored.
func TestNATSPublishPermissionRevokedAndRestored(t *testing.T) {
	t.Parallel()
	f := newRelayFixture(t)
	const prefix, user, password = "perm.", "relay", "relay-secret"
	storeDir, port := t.TempDir(), testenv.FreePort(t)
	opts := func(deny ...string) *natsserver.Options {
		return &natsserver.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: storeDir, NoSigs: true, NoLog: true,
			Users: []*natsserver.User{{Username: user, Password: password, Permissions: &natsserver.Permissions{
				Publish: &natsserver.SubjectPermission{Allow: []string{">"}, Deny: deny}}}}}
	}
	srv := testenv.NATSServer(t, opts())
	var logged testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, password), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.ErrorHandler(natssink.ErrorHandler(log)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e := &streamOps{t: t, name: "PERM", prefix: prefix}
	if e.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	e.create(e.name, ">")
	sink, err := natssink.New(natssink.Config{Conn: nc, Stream: e.name, SubjectPrefix: prefix, AckTimeout: 2 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	r := f.start(relay.Config{Table: f.table, Sinks: []relay.Sink{sink}, MaxAttempts: 1000, PublishTimeout: 3 * time.Second,
		PollInterval: 20 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	warm := f.insert(1, "orders.kept")
	testenv.Eventually(t, 10*time.Second, func() bool { return f.done(warm...) }, "the first row never reached the stream")

	if err := srv.ReloadOptions(opts(prefix + ">")); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	ids := f.insert(100, "orders.moved")
	testenv.Eventually(t, 2*time.Second, func() bool { return strings.Contains(logged.String(), "Permissions Violation for Publish") },
		"no log line naming the refused permission within 2 s:\n%s", &logged)
	testenv.Eventually(t, 15*time.Second, func() bool { return f.tried("nats", ids) && slices.Contains(r.Paused(), relay.TargetNATS) },
		"the rows were never tried, or the target never paused: %q", r.Unready())
	if s := f.stats(relay.TargetNATS); s.Lag <= 0 || s.Parked != 0 || s.Pending != int64(len(ids)) {
		t.Errorf("while refused: %+v, want the lag up, every row pending, none parked", s)
	}
	if n := f.attempts("nats", ids); n != 0 {
		t.Errorf("rows' attempts while refused: %d, want 0", n)
	}

	if err := srv.ReloadOptions(opts()); err != nil {
		t.Fatalf("restore: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return f.done(ids...) }, "the rows never reached the stream once the permission was back")
	got := e.ids(e.name)
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("row %s is in the stream %d times, want once", id, got[id])
		}
	}
	if s := f.stats(relay.TargetNATS); s.Parked != 0 {
		t.Errorf("%d rows parked", s.Parked)
	}
}
