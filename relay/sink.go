package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/relayd/relayd/internal/route"
)

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
	// Route is where the message goes; nil: where the sink sends a topic by
	// default (its exchange and the topic; its subject prefix and stream).
	Route *route.Dest
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

// Destinationer is a Sink that can name where a message goes (the
// exchange, the subject), for the spans of its publishes
// (messaging.destination.name). A sink without it is named by the topic.
type Destinationer interface {
	Destination(m *Message) string
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

// ErrReturned is a message RabbitMQ could not route to any queue.
var ErrReturned = errors.New("amqp: returned unroutable")

// ErrNacked is a message RabbitMQ refused to take responsibility for: a
// queue it was routed to is full and set to refuse (x-overflow
// reject-publish), or a queue's process failed. Unlike ErrOutOfRoom it
// counts as one of the row's attempts: a nack names no queue, and a message
// routed to several is in the others already, so retries back off and end,
// parked, after MaxAttempts (RELAY_MAX_ATTEMPTS=0: never).
var ErrNacked = errors.New("amqp: nacked by broker")

// ErrNoDestination marks a message whose route names an exchange or a
// stream that does not exist: the operator creates it, or fixes the route.
// As with ErrOutOfRoom the row waits without using up its attempts, and the
// target goes on with the rows of other routes.
var ErrNoDestination = errors.New("destination does not exist")

// NoDestination wraps err as ErrNoDestination.
func NoDestination(err error) error {
	return fmt.Errorf("%w: %w", ErrNoDestination, err)
}

// waits reports whether err is the broker's state that a row waits out
// without pausing its target: want of room, or a destination missing.
func waits(err error) bool {
	return errors.Is(err, ErrOutOfRoom) || errors.Is(err, ErrNoDestination)
}

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
