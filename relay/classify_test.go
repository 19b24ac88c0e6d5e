package relay

import (
	"errors"
	"testing"

	"github.com/relayd/relayd/internal/outboxsql"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	other := errors.New("returned unroutable")
	for _, tc := range []struct {
		name     string
		wanted   bool
		err      error
		attempts int32
		max      int
		want     outboxsql.Outcome
	}{
		{"not wanted", false, nil, 0, 20, outcomeNone},
		{"not wanted, failed", false, other, 0, 20, outcomeNone},
		{"delivered", true, nil, 0, 20, outcomeDelivered},
		{"delivered on the last attempt", true, nil, 19, 20, outcomeDelivered},
		{"permanent", true, Permanent("bad subject"), 0, 20, outcomeParked},
		{"permanent and unavailable", true, Unavailable(Permanent("x")), 0, 20, outcomeParked},
		{"unavailable", true, Unavailable(other), 0, 20, outcomeOutage},
		{"unavailable past max attempts", true, Unavailable(other), 50, 20, outcomeOutage},
		{"awaiting confirm", true, AwaitingConfirm(other), 0, 20, outcomeOutage},
		{"out of room", true, OutOfRoom(other), 0, 20, outcomeOutage},
		{"out of room past max attempts", true, OutOfRoom(other), 50, 20, outcomeOutage},
		{"failed", true, other, 0, 20, outcomeRetry},
		{"failed before the last attempt", true, other, 18, 20, outcomeRetry},
		{"failed on the last attempt", true, other, 19, 20, outcomeParked},
		{"failed, never park", true, other, 1000, -1, outcomeRetry},
		{"failed, max 1", true, other, 0, 1, outcomeParked},
	} {
		if got := classify(tc.wanted, tc.err, tc.attempts, tc.max); got != tc.want {
			t.Errorf("%s: outcome %d, want %d", tc.name, got, tc.want)
		}
	}
}
