package inbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/uuidtext"
)

func TestNormalizeID(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"0b6f4b1e-8c1d-4f0a-9a3e-5d2c7b8e9f10", "0b6f4b1e-8c1d-4f0a-9a3e-5d2c7b8e9f10", nil},
		{"0B6F4B1E-8C1D-4F0A-9A3E-5D2C7B8E9F10", "0b6f4b1e-8c1d-4f0a-9a3e-5d2c7b8e9f10", nil},
		{"0B6f4b1e-8c1d-4f0a-9a3e-5d2c7b8e9F10", "0b6f4b1e-8c1d-4f0a-9a3e-5d2c7b8e9f10", nil},
		// Not canonical UUIDs: kept exactly.
		{"0B6F4B1E8C1D4F0A9A3E5D2C7B8E9F10", "0B6F4B1E8C1D4F0A9A3E5D2C7B8E9F10", nil},
		{"{0B6F4B1E-8C1D-4F0A-9A3E-5D2C7B8E9F10}", "{0B6F4B1E-8C1D-4F0A-9A3E-5D2C7B8E9F10}", nil},
		{"0B6F4B1E-8C1D-4F0A-9A3E-5D2C7B8E9F1G", "0B6F4B1E-8C1D-4F0A-9A3E-5D2C7B8E9F1G", nil},
		{"Order-17", "Order-17", nil},
		{" x ", " x ", nil},
		{"", "", ErrNoMessageID},
		{strings.Repeat("a", MaxIDLength), strings.Repeat("a", MaxIDLength), nil},
		{strings.Repeat("a", MaxIDLength+1), "", ErrInvalidMessageID},
		{"a\x00", "", ErrInvalidMessageID},
		{"\xc3\x28", "", ErrInvalidMessageID},
	} {
		got, err := normalizeID(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("normalizeID(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func FuzzNormalizeID(f *testing.F) {
	for _, s := range []string{"0B6F4B1E-8C1D-4F0A-9A3E-5D2C7B8E9F10", "order-1", "", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := normalizeID(s)
		if err != nil {
			return
		}
		// Idempotent, and only ever changes a UUID's case.
		if again, _ := normalizeID(got); again != got {
			t.Fatalf("normalizeID not idempotent: %q -> %q -> %q", s, got, again)
		}
		if !strings.EqualFold(got, s) || (got != s && !uuidtext.Is(s)) {
			t.Fatalf("normalizeID(%q) = %q", s, got)
		}
	})
}

func TestRetryDelay(t *testing.T) {
	in := &Inbox{cfg: Config{RetryMin: time.Second, RetryMax: time.Minute}}
	for delivered, want := range map[uint64]time.Duration{
		0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second,
		7: time.Minute, 8: time.Minute, 1 << 62: time.Minute,
	} {
		if got := in.retryDelay(delivered); got != want {
			t.Errorf("retryDelay(%d) = %v, want %v", delivered, got, want)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	var c Config
	c.setDefaults()
	if c.Table != "inbox" || c.Consumer != "default" || c.Retention != 7*24*time.Hour ||
		c.RetryMin != time.Second || c.RetryMax != time.Minute || c.Logger == nil || c.Registerer != nil {
		t.Fatalf("defaults: %+v", c)
	}
	c = Config{RetryMin: 2 * time.Minute}
	c.setDefaults()
	if c.RetryMax != 2*time.Minute {
		t.Fatalf("RetryMax with RetryMin 2m defaults to %v, want 2m", c.RetryMax)
	}
}

// RunCleanup against a table that does not exist fails every pass but logs
// once; cancelling it logs nothing.
func TestRunCleanupLogsWithoutFlooding(t *testing.T) {
	t.Parallel()
	var buf testenv.SyncBuffer
	in, err := New(testenv.Pool(t), Config{
		Table:  testenv.Name("nosuch") + ".inbox",
		Logger: slog.New(slog.NewTextHandler(&buf, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	var passes, failed atomic.Int64
	in.cleanupHook = func(err error) {
		passes.Add(1)
		if err != nil {
			failed.Add(1)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { in.RunCleanup(ctx, time.Millisecond); close(done) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return passes.Load() >= 20 }, "RunCleanup made fewer than 20 passes")
	cancel()
	<-done
	out := buf.String()
	if failed.Load() != passes.Load() || strings.Count(out, "\n") != 1 || !strings.Contains(out, "does not exist") {
		t.Fatalf("%d passes, %d failed; want every pass failed and one log line naming the missing table:\n%s", passes.Load(), failed.Load(), out)
	}
	if strings.Contains(out, "canceled") {
		t.Fatalf("context cancellation logged:\n%s", out)
	}
}
