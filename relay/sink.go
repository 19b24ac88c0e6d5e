package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Target names a broker the relay publishes to. It is also the prefix of the
// target's delivery columns in the outbox table and the value of the
// `target` metric label.
type Target string

// The targets. Their order is the order of the RELAY_TARGETS phases.
const (
	TargetAMQP Target = "amqp" // the legacy RabbitMQ exchange
	TargetNATS Target = "nats" // the new JetStream stream
)

// Targets lists every target the relay knows, in a fixed order.
var Targets = []Target{TargetAMQP, TargetNATS}

// ParseTargets parses a comma-separated RELAY_TARGETS value: a non-empty set
// of known targets, each at most once.
func ParseTargets(s string) ([]Target, error) {
	if s == "" {
		return nil, errors.New("empty: want amqp, nats or amqp,nats")
	}
	seen := map[Target]bool{}
	var out []Target
	for _, part := range splitComma(s) {
		t := Target(part)
		if t != TargetAMQP && t != TargetNATS {
			return nil, fmt.Errorf("unknown target %q: want amqp, nats or amqp,nats", part)
		}
		if seen[t] {
			return nil, fmt.Errorf("target %q given twice", part)
		}
		seen[t] = true
	}
	for _, t := range Targets { // canonical order
		if seen[t] {
			out = append(out, t)
		}
	}
	return out, nil
}

// splitComma splits a comma-separated list, trimming the spaces (only
// spaces) around each part.
func splitComma(s string) []string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.Trim(p, " ")
	}
	return parts
}

// Message is one outbox row on its way to a broker.
type Message struct {
	ID        int64             // the row's id
	MessageID string            // the row's message_id: Nats-Msg-Id and AMQP message-id
	Topic     string            // subject suffix / routing key
	Key       string            // ordering key; "" when the row's key is NULL
	HasKey    bool              // whether the row's key is non-NULL
	Headers   map[string]string // copied into the broker's headers
	Payload   []byte
	CreatedAt time.Time
}

// Sink publishes messages to one broker with confirmation.
//
// Contract:
//   - Publish sends every message and waits for the broker's verdict on each;
//     results[i] is nil only when the broker confirmed msgs[i] (stored it, or
//     for JetStream, recognised it as a duplicate of a stored message). It
//     returns when every message has a verdict or ctx is done; a message
//     without a verdict by then gets an error wrapping ErrUnavailable
//     ("unknown: publish again with the same id").
//   - An error wrapping ErrUnavailable means the broker, not the message, is
//     the problem (disconnected, timed out). An error wrapping ErrOutOfRoom
//     means the broker refused the message for want of room (a full stream).
//     An error of type *PermanentError means this message can never be
//     published as it is: it is parked. Any other error is a per-message
//     failure (returned unroutable, nacked) that is retried with backoff and
//     counts toward MaxAttempts.
//   - Publishing the same MessageID again must be safe: the broker or the
//     consumer dedupes by it.
//   - Publish and Ready are safe for concurrent use; callers publish several
//     batches at once to keep hundreds of confirms in flight.
type Sink interface {
	Target() Target
	Publish(ctx context.Context, msgs []*Message, results []error)
	// Ready returns nil while the broker connection is up.
	Ready() error
}

// LateConfirmer is a Sink whose broker may confirm a message after Publish
// gave up waiting for it (ErrAwaitingConfirm). The relay records such a
// confirm as a delivery at once: otherwise another relay instance, retrying
// the row, would publish a second copy.
type LateConfirmer interface {
	// OnLateConfirm has f called with the message id of every message
	// confirmed after its Publish returned without a verdict. f must not
	// block.
	OnLateConfirm(f func(messageID string))
}

// RetryBounder is a Sink whose broker dedupes a message published again
// only within a window from its first store (JetStream's duplicate window).
// A publish whose outcome is unknown (ErrUnavailable) may have been stored:
// its row must go again within the window, or the broker stores a second
// copy. The relay keeps the backoff of such a row below RetryBound (the
// window less the time a publish may take and a claim may come late). A
// broker down longer than that still leaves the retry past the window.
type RetryBounder interface {
	RetryBound() time.Duration
}

// ErrAwaitingConfirm marks a publish the broker had not answered by the
// deadline on a connection that is still up: its confirm may yet come. It
// always comes wrapped together with ErrUnavailable (see AwaitingConfirm):
// the outcome is unknown, and the row is retried, but not before a further
// PublishTimeout, so that a late confirm (LateConfirmer) can be recorded
// first.
var ErrAwaitingConfirm = errors.New("awaiting confirm")

// AwaitingConfirm wraps err as ErrUnavailable and ErrAwaitingConfirm.
func AwaitingConfirm(err error) error {
	return fmt.Errorf("%w: %w: %w", ErrUnavailable, ErrAwaitingConfirm, err)
}

// ErrUnavailable marks a failure of the broker or the connection to it: the
// outcome of the publish is unknown and it will be retried.
var ErrUnavailable = errors.New("broker unavailable")

// ErrOutOfRoom marks a message the broker refused for want of room — a
// JetStream stream at its limits with DiscardNew, an account or server out
// of storage — which it will take once it has room: the broker's state, not
// the message's. The row waits, retried after a backoff that grows with its
// age, and never uses up its attempts (a stream full for an hour would park
// every row that came meanwhile). It does not pause the target: with one
// subject full, the others go on.
var ErrOutOfRoom = errors.New("broker out of room")

// OutOfRoom wraps err as ErrOutOfRoom.
func OutOfRoom(err error) error {
	return fmt.Errorf("%w: %w", ErrOutOfRoom, err)
}

// PermanentError is a message that the broker will never accept as it is
// (an invalid subject, a payload over the broker's limit, headers that are
// not a flat string object). Such a row is parked with Reason.
type PermanentError struct {
	Reason string
}

func (e *PermanentError) Error() string { return "permanent: " + e.Reason }

// Permanent returns a *PermanentError with a formatted reason.
func Permanent(format string, args ...any) error {
	return &PermanentError{Reason: fmt.Sprintf(format, args...)}
}

// Unavailable wraps err as ErrUnavailable.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// IsPermanent reports whether err is a *PermanentError.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}
