package sinktest

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// RequireAllNil fails unless every result is nil.
func RequireAllNil(t *testing.T, msgs []*relay.Message, results []error) {
	t.Helper()
	var bad []string
	for i, err := range results {
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", msgs[i].MessageID, err))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d of %d messages not confirmed, want all; first: %s", len(bad), len(msgs), bad[0])
	}
}

// RequireAllUnavailable fails unless every result wraps relay.ErrUnavailable.
func RequireAllUnavailable(t *testing.T, msgs []*relay.Message, results []error) {
	t.Helper()
	for i, err := range results {
		switch {
		case err == nil:
			t.Fatalf("message %s confirmed (nil) while the broker is down", msgs[i].MessageID)
		case !errors.Is(err, relay.ErrUnavailable):
			t.Fatalf("message %s: result %v (%T) while the broker is down, want an error wrapping relay.ErrUnavailable", msgs[i].MessageID, err, err)
		}
	}
}

// WaitArrived polls until every message in msgs is at the broker at least
// once and returns what was received.
func WaitArrived(t *testing.T, b Broker, msgs []*relay.Message) map[string][]Delivery {
	t.Helper()
	var got map[string][]Delivery
	var missing []string
	testenv.Eventually(t, arriveTimeout, func() bool {
		got = b.Received(t)
		missing = missing[:0]
		for _, m := range msgs {
			if len(got[m.MessageID]) == 0 {
				missing = append(missing, m.MessageID)
			}
		}
		return len(missing) == 0
	}, "%v", lazy(func() string {
		return fmt.Sprintf("%d of %d confirmed messages never arrived at the broker, e.g. %v", len(missing), len(msgs), head(missing))
	}))
	return got
}

// Settle publishes one sentinel message and waits for it. Brokers keep the
// order of one publisher's messages to one queue or stream, so everything
// the sink published before is then at the broker too: a later copy cannot
// still be on its way. It returns what was received.
func Settle(t *testing.T, sink relay.Sink, b Broker) map[string][]Delivery {
	t.Helper()
	s := Messages("sentinel", 1)
	RequireAllNil(t, s, Publish(t, sink, publishTimeout, s))
	return WaitArrived(t, b, s)
}

// RequireCounts fails unless every message of msgs is at the broker want
// times, and nothing else is there but sentinels and the suite's own
// warm-up messages.
func RequireCounts(t *testing.T, got map[string][]Delivery, msgs []*relay.Message, want int) {
	t.Helper()
	sent := make(map[string]bool, len(msgs))
	var wrong []string
	for _, m := range msgs {
		sent[m.MessageID] = true
		if n := len(got[m.MessageID]); n != want {
			wrong = append(wrong, fmt.Sprintf("%s x%d", m.MessageID, n))
		}
	}
	var extra []string
	for id := range got {
		if !sent[id] && !strings.HasPrefix(id, "sentinel_") {
			extra = append(extra, id)
		}
	}
	sort.Strings(wrong)
	sort.Strings(extra)
	if len(wrong) > 0 {
		t.Errorf("%d of %d messages are not at the broker exactly %d time(s): %v", len(wrong), len(msgs), want, head(wrong))
	}
	if len(extra) > 0 {
		t.Errorf("%d messages at the broker that were never published: %v", len(extra), head(extra))
	}
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}

// lazy is formatted by calling it, so a failure message shows the state at
// the time of the failure, not when Eventually was called.
type lazy func() string

func (l lazy) String() string { return l() }
