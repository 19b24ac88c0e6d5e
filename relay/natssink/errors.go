package natssink

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/relay"
)

// JetStream API error codes.
const (
	errCodeMaxMsgSize   = 10054 // message size exceeds maximum allowed: no retry will fix it
	errCodeStreamSealed = 10109 // invalid operation on sealed stream: for good, for every row
)

// ErrNoStream: the configured stream (RELAY_NATS_STREAM) does not exist:
// deleted, or not re-created yet. It wraps relay.ErrUnavailable: the target
// waits for it, and no row uses up an attempt.
var ErrNoStream = errors.New("stream does not exist")

// ErrNotCaptured: the configured stream exists but does not capture the
// message's subject, the twin of an AMQP message returned unroutable: the
// row is retried, counting its attempts, and parked when they run out.
var ErrNotCaptured = errors.New("subject not captured by the stream")

// badHeaders says why NATS refuses one of h's keys, or "".
func badHeaders(h map[string]string) string {
	return headers.First(h, func(k, _ string) string { return cmp.Or(headers.NATSKeyReason(k), headers.NATSReservedReason(k)) })
}

func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMaxMsgSize:
		return relay.Permanent("nats: %v", err)
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadHeaderMsg):
		return relay.Permanent("nats: %v", err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamSealed:
		// The stream takes nothing more: the operator's to replace.
		return relay.Unavailable(fmt.Errorf("nats: %w: set RELAY_NATS_STREAM to a stream that takes new messages", err))
	case errors.As(err, &apiErr) && jspub.OutOfRoom(apiErr):
		return relay.OutOfRoom(fmt.Errorf("nats: %w", err))
	case errors.As(err, &apiErr):
		return fmt.Errorf("nats: %w", err) // a per-message refusal (a stream mismatch: see Sink.route): retry later
	default:
		// Timeouts, disconnects, no responders (JetStream restarting, or
		// no stream for the subject): unknown, publish again.
		return relay.Unavailable(fmt.Errorf("nats: %w", err))
	}
}

// ErrorHandler logs what the NATS server refuses outside any reply (a
// permissions violation on publish, a slow consumer), at once and then at
// most every 30 s per error: a publish it refuses only times out, and the
// target pauses without saying why. Set it on the sink's connection
// (nats.ErrorHandler).
func ErrorHandler(log *slog.Logger) nats.ErrHandler {
	warn := errlog.NewPerKey(log, warnKeys)
	return func(nc *nats.Conn, _ *nats.Subscription, err error) {
		if err == nil {
			return
		}
		warn.Warn(err.Error(), "the NATS server refused an operation: publishes it refuses time out, and the target waits until it is fixed "+
			"(a permission: grant publish on the stream's subjects and $JS.API.>)", "error", err.Error(), "server", nc.ConnectedUrlRedacted())
	}
}
