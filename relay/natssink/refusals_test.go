package natssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
)

// verdict is what the relay makes of a publish's result for its row.
type verdict string

const (
	park    verdict = "park"              // the row, wrong in itself
	attempt verdict = "retry, an attempt" // parked when its attempts run out
	wait    verdict = "wait, no attempt"  // the broker's state: room, a restart
	pause   verdict = "pause the target"  // the broker's state, for every row
)

func verdictOf(err error) verdict {
	switch {
	case relay.IsPermanent(err):
		return park
	case errors.Is(err, relay.ErrUnavailable):
		return pause
	case errors.Is(err, relay.ErrOutOfRoom), errors.Is(err, relay.ErrNoDestination):
		return wait
	}
	return attempt
}

// lookupAnswers is a jspub.StreamLookup with set answers.
type lookupAnswers struct {
	noStream       bool
	missing, known bool
}

func (l lookupAnswers) NoStream(context.Context, string) bool { return l.noStream }
func (l lookupAnswers) StreamMissing(context.Context, string) (bool, bool) {
	return l.missing, l.known
}

func apiErr(code jetstream.ErrorCode, desc string) error {
	return &jetstream.APIError{Code: 400, ErrorCode: code, Description: desc}
}

// Every refusal JetStream gives a publish, with what JetStream says of
// the stream, and the verdict. A new refusal needs a row here: what an
// operator can fix on the broker pauses or waits, never parks.
func TestRefusals(t *testing.T) {
	exists := lookupAnswers{known: true}
	routed := &route.Dest{Subject: "billing.x", Stream: "BILLING"} // a route's own stream
	for _, tc := range []struct {
		name   string
		err    error
		lookup lookupAnswers
		want   verdict
		route  *route.Dest // nil: the default route
	}{
		// A route names its stream and its subject: what JetStream refuses
		// for where the subject goes is the operator's, for that route's
		// rows alone.
		{"a route's stream missing", nats.ErrNoResponders, lookupAnswers{noStream: true, missing: true, known: true}, wait, routed},
		{"a route's stream not capturing its subject", nats.ErrNoResponders, lookupAnswers{noStream: true, known: true}, wait, routed},
		{"a route's stream: another stream captures its subject", apiErr(10060, "expected stream does not match"), exists, wait, routed},
		{"a route's stream full", apiErr(10077, "maximum messages exceeded"), exists, wait, routed},
		{"a route's message over max_payload", nats.ErrMaxPayload, exists, park, routed},
		{"message over the stream's max_msg_size", apiErr(10054, "message size exceeds maximum allowed"), exists, park, nil},
		{"message over the server's max_payload", nats.ErrMaxPayload, exists, park, nil},
		{"a header NATS refuses", nats.ErrBadHeaderMsg, exists, park, nil},
		{"no responders, the stream missing", nats.ErrNoResponders, lookupAnswers{noStream: true, missing: true, known: true}, pause, nil},
		{"no stream response, the stream missing", jetstream.ErrNoStreamResponse, lookupAnswers{noStream: true, missing: true, known: true}, pause, nil},
		{"no responders, the stream does not capture the subject", nats.ErrNoResponders, lookupAnswers{noStream: true, known: true}, attempt, nil},
		{"no responders, the stream lookup unanswered", nats.ErrNoResponders, lookupAnswers{noStream: true}, pause, nil},
		{"no responders while JetStream restarts", nats.ErrNoResponders, exists, pause, nil},
		{"expected stream mismatch, the stream missing (re-created under another name)", apiErr(10060, "expected stream does not match"), lookupAnswers{missing: true, known: true}, pause, nil},
		{"expected stream mismatch, another stream captures the subject", apiErr(10060, "expected stream does not match"), exists, attempt, nil},
		{"expected stream mismatch, the stream lookup unanswered", apiErr(10060, "expected stream does not match"), lookupAnswers{}, pause, nil},
		{"stream full at MaxMsgs, DiscardNew", apiErr(10077, "maximum messages exceeded"), exists, wait, nil},
		{"stream full at MaxBytes, DiscardNew", apiErr(10077, "maximum bytes exceeded"), exists, wait, nil},
		{"subject full at MaxMsgsPerSubject", apiErr(10077, "maximum messages per subject exceeded"), exists, wait, nil},
		{"account out of resources", apiErr(10002, "resource limits exceeded for account"), exists, wait, nil},
		{"server out of resources", apiErr(10023, "insufficient resources"), exists, wait, nil},
		{"the store failing otherwise", apiErr(10077, "disk I/O error"), exists, attempt, nil},
		{"stream sealed", apiErr(10109, "invalid operation on sealed stream"), exists, pause, nil},
		{"a timeout", nats.ErrTimeout, exists, pause, nil},
		{"a disconnect", nats.ErrConnectionClosed, exists, pause, nil},
		{"a context deadline", context.DeadlineExceeded, exists, pause, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Sink{cfg: Config{Stream: "OUTBOX", SubjectPrefix: "outbox.", Conn: &nats.Conn{}}, warn: errlog.NewPerKey(slog.New(slog.DiscardHandler), 8)}
			got := s.route(context.Background(), &relay.Message{Topic: "orders.created", MessageID: "m", Route: tc.route}, classify(fmt.Errorf("publish: %w", tc.err)), tc.lookup)
			if v := verdictOf(got); v != tc.want {
				t.Errorf("%v: %s (%v), want %s", tc.err, v, got, tc.want)
			}
		})
	}
}
