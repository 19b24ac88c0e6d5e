package jspub

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errCodeStreamMismatch is JetStream's "expected stream does not match":
// another stream than Nats-Expected-Stream's captures the subject.
const errCodeStreamMismatch = 10060

// StreamLookup is what JetStream says, in one batch, of the streams
// (*Lookup).
type StreamLookup interface {
	// NoStream: JetStream said no stream captures subject.
	NoStream(ctx context.Context, subject string) bool
	// StreamMissing: JetStream said stream name does not exist; known is
	// false when it did not answer.
	StreamMissing(ctx context.Context, name string) (missing, known bool)
}

// Where is what a refused publish says of where its subject goes: what the
// operator changes on JetStream, never the message's fault.
type Where int

const (
	// WhereElse: not such a refusal ("no responders" while JetStream
	// restarts, or another refusal).
	WhereElse Where = iota
	// WhereUnknown: such a refusal, and JetStream did not say whether the
	// stream exists.
	WhereUnknown
	// WhereNoStream: the configured stream does not exist.
	WhereNoStream
	// WhereNotCaptured: the stream exists; no stream captures the subject.
	WhereNotCaptured
	// WhereOtherStream: the stream exists; another stream captures the
	// subject.
	WhereOtherStream
)

// WhereTo settles err, a publish to subject refused, against stream, the
// one the publish expected (Nats-Expected-Stream): the relay's sink and the
// backfill decide on the same answer.
func WhereTo(ctx context.Context, l StreamLookup, err error, subject, stream string) Where {
	var apiErr *jetstream.APIError
	mismatch := errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamMismatch
	noResponders := errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
	if !mismatch && (!noResponders || !l.NoStream(ctx, subject)) {
		return WhereElse
	}
	if stream == "" { // any stream would do, and none captures it
		return WhereNotCaptured
	}
	switch missing, known := l.StreamMissing(ctx, stream); {
	case !known:
		return WhereUnknown
	case missing:
		return WhereNoStream
	case mismatch:
		return WhereOtherStream
	}
	return WhereNotCaptured
}
