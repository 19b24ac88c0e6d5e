package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/verify"
)

func TestParseWhen(t *testing.T) {
	now := time.Date(2024, 5, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"24h", now.Add(-24 * time.Hour), true},
		{"90m", now.Add(-90 * time.Minute), true},
		{"0s", now, true},
		{"2024-05-01T00:00:00Z", time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC), true},
		{"2024-05-01T02:00:00.5+02:00", time.Date(2024, 5, 1, 0, 0, 0, 5e8, time.UTC), true},
		{"-1h", time.Time{}, false},
		{"yesterday", time.Time{}, false},
		{"2024-05-01", time.Time{}, false},
		{"", time.Time{}, false},
	} {
		got, err := parseWhen(tc.in, now)
		if (err == nil) != tc.ok || (tc.ok && !got.Equal(tc.want)) {
			t.Errorf("parseWhen(%q) = %s, %v; want %s, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// Usage errors exit 2 before anything is connected.
func TestVerifyUsage(t *testing.T) {
	env := envconfig.MapLookuper(base())
	for _, args := range [][]string{
		{"--since", "yesterday"},
		{"--until", "-5m"},
		{"--since", "1h", "--until", "2h"},
		{"--examples", "-1"},
		{"--slack", "0s"},
		{"--bogus"},
		{"extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(append([]string{"verify"}, args...), &out, &errOut, env); code != exitUsage {
			t.Errorf("verify %v: exit %d, want %d (stderr %q)", args, code, exitUsage, errOut.String())
		}
		if errOut.Len() == 0 || strings.Count(errOut.String(), "\n") != 1 {
			t.Errorf("verify %v: want one line on stderr, got %q", args, errOut.String())
		}
	}
	var out bytes.Buffer
	if code := run([]string{"verify", "--help"}, &out, &out, env); code != exitOK || !strings.Contains(out.String(), "--since") {
		t.Errorf("--help: exit %d, output %q", code, out.String())
	}
}

// relayd verify against the real services: exit 0 and "OK" when the stream
// matches, exit 1 naming the id once a message is deleted, --json decodes.
func TestVerifyCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and NATS")
	}
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := strings.ToUpper(testenv.Name("cmdverify"))
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(ctx, name) //nolint:errcheck // cleanup
	var ids []string
	if err := pool.QueryRow(ctx, `WITH r AS (INSERT INTO `+table.Ident()+` (topic, payload)
		SELECT 'orders', '\x7b7d' FROM generate_series(1, 5) RETURNING message_id::text) SELECT array_agg(message_id) FROM r`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	testenv.SetState(t, pool, table, `nats_delivered_at = now()`, `true`)
	var seqs []uint64
	for _, id := range ids {
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: strings.ToLower(name) + ".orders", Data: []byte("{}")}, jetstream.WithMsgID(id))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	env := envconfig.MapLookuper(map[string]string{
		"RELAY_DATABASE_URL": testenv.DatabaseURL(t),
		"RELAY_NATS_URL":     testenv.NATSURL(t),
		"RELAY_OUTBOX_TABLE": table.String(),
		"RELAY_NATS_STREAM":  name,
	})

	var out, errOut bytes.Buffer
	if code := run([]string{"verify"}, &out, &errOut, env); code != exitOK || !strings.Contains(out.String(), "OK: nothing missing or duplicated") ||
		!strings.Contains(out.String(), "5 delivered ids checked: 0 missing, 0 duplicated") {
		t.Fatalf("clean: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}

	if err := stream.DeleteMsg(ctx, seqs[1]); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"verify", "--since", "1h"}, &out, &errOut, env); code != exitFailure ||
		!strings.Contains(out.String(), "missing     "+ids[1]) || !strings.Contains(out.String(), "FAILED: 1 missing") {
		t.Fatalf("deleted: exit %d, want 1 naming %s\n%s", code, ids[1], out.String())
	}

	out.Reset()
	code := run([]string{"verify", "--json", "--since", time.Now().Add(-time.Hour).Format(time.RFC3339)}, &out, &errOut, env)
	var rep verify.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, out.String())
	}
	if code != exitFailure || rep.Outbox.Missing != 1 || rep.Outbox.MissingExamples[0].ID != ids[1] || rep.Scan.Messages != 4 {
		t.Errorf("--json: exit %d, report %+v", code, rep)
	}

	out.Reset()
	if code := run([]string{"verify", "--examples", "0"}, &out, &errOut, env); code != exitFailure || strings.Contains(out.String(), "missing     ") {
		t.Errorf("--examples 0: exit %d, want 1 and no examples\n%s", code, out.String())
	}

	errOut.Reset()
	noStream := envconfig.MultiLookuper(envconfig.MapLookuper(map[string]string{"RELAY_NATS_STREAM": "NO_SUCH_STREAM"}), env)
	if code := run([]string{"verify"}, &out, &errOut, noStream); code != exitFailure || !strings.Contains(errOut.String(), "stream NO_SUCH_STREAM not found") {
		t.Errorf("no stream: exit %d, want 1 naming it\n%s", code, errOut.String())
	}
}
