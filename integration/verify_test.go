package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/verify"
	"github.com/relayd/relayd/outbox"
)

// runVerify runs `relayd verify` with args and returns its exit code, its
// stdout and its stderr.
func (e *env) runVerify(args ...string) (int, string, string) {
	e.t.Helper()
	cmd := exec.Command(relaydBin, append([]string{"verify"}, args...)...)
	cmd.Env = e.relayEnv("RELAY_METRICS_ADDR=")
	var out, errOut testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		e.t.Fatalf("run relayd verify: %v", err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

func decodeReport(t *testing.T, stdout, stderr string) verify.Report {
	t.Helper()
	var r verify.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("verify --json: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	return r
}

// The relay's rows and a backfill's messages, then a message deleted from
// the stream and one stored twice: `relayd verify` exits 0 while the stream
// matches the outbox's record and 1 naming the ids once it does not.
func TestVerifyAfterRelayAndBackfill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	msgs := make([]outbox.Message, 300)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "orders.created", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	ids, err := e.writer.Write(ctx, e.pool, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("relay")
	e.waitDelivered(30 * time.Second)
	if code := r.stop(30 * time.Second); code != 0 {
		t.Fatalf("relay exited %d", code)
	}

	var legacy []amqp.Publishing
	for i := range 50 {
		legacy = append(legacy, amqp.Publishing{MessageId: fmt.Sprintf("legacy-%03d", i), Body: []byte("{}"), DeliveryMode: amqp.Persistent})
	}
	e.legacyPublish(legacy, "orders.legacy")
	if out, err := e.backfillCmd().CombinedOutput(); err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}

	code, stdout, stderr := e.runVerify("--json")
	rep := decodeReport(t, stdout, stderr)
	if code != 0 || !rep.OK() || rep.Outbox.Checked != 300 || rep.Backfill.Checked != 50 || rep.Scan.Messages != 350 {
		t.Fatalf("clean: exit %d, want 0 with 300 outbox and 50 backfilled ids checked, 350 messages; got %+v\n%s", code, rep, stderr)
	}

	// Lose one relayed message and one backfilled one, and store a relayed
	// id a second time once the (now short) duplicate window has passed.
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	seqOf := e.streamSeqs(s, ids[7], "legacy-010", ids[20])
	for _, id := range []string{ids[7], "legacy-010"} {
		if err := s.DeleteMsg(ctx, seqOf[id]); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	scfg := s.CachedInfo().Config
	scfg.Duplicates = 100 * time.Millisecond
	if _, err := e.js.UpdateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	var again uint64
	testenv.Eventually(t, 10*time.Second, func() bool {
		ack, err := e.js.Publish(ctx, e.prefix+"orders.created", []byte("{}"), jetstream.WithMsgID(ids[20]))
		if err != nil {
			t.Fatal(err)
		}
		again = ack.Sequence
		return !ack.Duplicate
	}, "%s still dropped as a duplicate", ids[20])

	code, stdout, stderr = e.runVerify("--json", "--since", "1h")
	rep = decodeReport(t, stdout, stderr)
	if code != 1 || rep.OK() || rep.Outbox.Missing != 1 || rep.Outbox.MissingExamples[0].ID != ids[7] ||
		rep.Backfill.Missing != 1 || rep.Backfill.MissingExamples[0].ID != "legacy-010" {
		t.Fatalf("tampered: exit %d, want 1 with %s and legacy-010 missing; got %+v\n%s", code, ids[7], rep, stderr)
	}
	want := []uint64{seqOf[ids[20]], again}
	if rep.Outbox.Duplicated != 1 || rep.Outbox.DuplicatedExamples[0].ID != ids[20] || !slices.Equal(rep.Outbox.DuplicatedExamples[0].Seqs, want) ||
		rep.StreamDuplicates.IDs != 1 {
		t.Fatalf("tampered: want %s duplicated at %v; got outbox %+v, stream %+v", ids[20], want, rep.Outbox, rep.StreamDuplicates)
	}

	code, stdout, _ = e.runVerify("--examples", "3")
	if code != 1 || !strings.Contains(stdout, "missing     "+ids[7]) || !strings.Contains(stdout, "FAILED") {
		t.Errorf("human output: exit %d, want 1 naming %s:\n%s", code, ids[7], stdout)
	}

	if code, _, stderr := e.runVerify("--since", "yesterday"); code != 2 || !strings.Contains(stderr, "--since") {
		t.Errorf("bad --since: exit %d, want 2\n%s", code, stderr)
	}
}

// streamSeqs reads the whole stream and returns the sequence of each of ids.
func (e *env) streamSeqs(s jetstream.Stream, ids ...string) map[string]uint64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]uint64{}
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := c.Fetch(int(min(1000, info.State.Msgs-read)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			e.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				e.t.Fatal(err)
			}
			if id := m.Headers().Get(jetstream.MsgIDHeader); slices.Contains(ids, id) {
				out[id] = md.Sequence.Stream
			}
		}
		if batch.Error() != nil || n == 0 {
			e.t.Fatalf("read stream: %d of %d messages: %v", read, info.State.Msgs, batch.Error())
		}
		read += uint64(n)
	}
	if len(out) != len(ids) {
		e.t.Fatalf("found %v in the stream, want all of %v", out, ids)
	}
	return out
}
