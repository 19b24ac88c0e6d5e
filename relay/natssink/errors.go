package natssink

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/internal/jspub"
	"github.com/relayd/relayd/relay"
)

// JetStream API error codes that no retry will fix.
const (
	errCodeMaxMsgSize     = 10054 // message size exceeds maximum allowed
	errCodeStreamMismatch = 10060 // expected stream does not match
)

// badHeaders says why NATS refuses one of h's keys, or "".
func badHeaders(h map[string]string) string {
	return headers.First(h, func(k, _ string) string { return cmp.Or(headers.NATSKeyReason(k), headers.NATSReservedReason(k)) })
}

func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == errCodeMaxMsgSize || apiErr.ErrorCode == errCodeStreamMismatch):
		return relay.Permanent("nats: %v", err)
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadHeaderMsg):
		return relay.Permanent("nats: %v", err)
	case errors.As(err, &apiErr) && jspub.OutOfRoom(apiErr):
		return relay.OutOfRoom(fmt.Errorf("nats: %w", err))
	case errors.As(err, &apiErr):
		return fmt.Errorf("nats: %w", err) // a per-message refusal: retry later
	default:
		// Timeouts, disconnects, no responders (JetStream restarting, or
		// no stream for the subject): unknown, publish again.
		return relay.Unavailable(fmt.Errorf("nats: %w", err))
	}
}
