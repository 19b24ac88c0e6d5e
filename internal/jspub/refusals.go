package jspub

import (
	"context"
	"errors"
	"net/textproto"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Lookup answers, for one batch, whether no stream captures a subject: the
// question a "no responders" PubAck raises, since JetStream answers so both
// for a subject no stream captures (refuse the message for good) and while
// it restarts or elects a leader (publish it again later). It asks once per
// subject, and not again in the batch once JetStream did not answer: a
// restart answers a whole batch with "no responders".
type Lookup struct {
	js   jetstream.JetStream
	none map[string]bool
	by   map[string]string // the stream that captures a subject ("": none, or not known)
	down bool              // a lookup failed other than "not found"
	// streams: whether each stream exists, asked once.
	streams map[string]streamAnswer
	// maxBytes: each stream's MaxBytes, looked up by TooLarge (0: the
	// lookup failed, or no limit).
	maxBytes map[string]int64
}

// NewLookup returns a lookup for one batch.
func NewLookup(js jetstream.JetStream) *Lookup {
	return &Lookup{js: js, none: map[string]bool{}, by: map[string]string{}, streams: map[string]streamAnswer{}, maxBytes: map[string]int64{}}
}

// NoStream reports whether JetStream said that no stream captures subject.
// false means a stream does, or JetStream could not say.
func (l *Lookup) NoStream(ctx context.Context, subject string) bool {
	if none, ok := l.none[subject]; ok || l.down {
		return none
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	name, err := l.js.StreamNameBySubject(lctx, subject)
	none := errors.Is(err, jetstream.ErrStreamNotFound)
	l.down = err != nil && !none
	l.none[subject], l.by[subject] = none, name
	return none
}

// StreamOf is the stream that captures subject, or "" when none does or
// JetStream could not say.
func (l *Lookup) StreamOf(ctx context.Context, subject string) string {
	l.NoStream(ctx, subject)
	return l.by[subject]
}

// streamAnswer is what JetStream said of a stream's existence.
type streamAnswer int

const (
	streamNotAsked streamAnswer = iota
	streamExists
	streamMissing
	streamUnknown // JetStream did not answer
)

// StreamMissing reports whether JetStream said that the stream name does
// not exist (deleted, or not re-created yet); known is false when it did
// not answer. It asks once per batch and stream.
func (l *Lookup) StreamMissing(ctx context.Context, name string) (missing, known bool) {
	a := l.streams[name]
	if a == streamNotAsked {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := l.js.Stream(lctx, name)
		switch {
		case err == nil:
			a = streamExists
		case errors.Is(err, jetstream.ErrStreamNotFound):
			a = streamMissing
		default:
			a = streamUnknown
		}
		l.streams[name] = a
	}
	return a == streamMissing, a != streamUnknown
}

// JetStream's refusals of a publish for want of room: the broker's state,
// not the message's. A stream with DiscardNew at its MaxMsgs, MaxBytes or
// MaxMsgsPerSubject refuses new messages until its consumers or MaxAge make
// room: the store's refusal, 10077, with the store's reason as the
// description (10077 with any other reason — a message too large for the
// store, a failing disk — is not room); an account or a server past its
// storage limits refuses with 10002 or 10023.
const (
	errCodeAccountResources = 10002 // resource limits exceeded for account
	errCodeInsufficient     = 10023 // insufficient resources
	errCodeStoreFailed      = 10077 // the store's reason as the description

	descMaxMsgs           = "maximum messages exceeded"
	descMaxBytes          = "maximum bytes exceeded" // also for a message over the whole of MaxBytes: see TooLarge
	descMaxMsgsPerSubject = "maximum messages per subject exceeded"
)

// OutOfRoom reports whether JetStream refused a publish for want of room.
func OutOfRoom(e *jetstream.APIError) bool {
	switch e.ErrorCode {
	case errCodeAccountResources, errCodeInsufficient:
		return true
	case errCodeStoreFailed:
		return e.Description == descMaxMsgs || e.Description == descMaxBytes || e.Description == descMaxMsgsPerSubject
	}
	return false
}

// TooLarge reports whether err is stream's "maximum bytes exceeded" for a
// message m larger than the stream's whole MaxBytes (it can never be
// stored), and that MaxBytes. The stream is looked up once per batch, on the
// first such refusal; when that fails, TooLarge says false (publish again
// later).
func (l *Lookup) TooLarge(ctx context.Context, stream string, m *nats.Msg, err error) (maxBytes int64, tooLarge bool) {
	if !MaxBytesRefused(err) {
		return 0, false
	}
	most, asked := l.maxBytes[stream]
	if !asked {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if st, err := l.js.Stream(lctx, stream); err == nil {
			most = st.CachedInfo().Config.MaxBytes
		}
		l.maxBytes[stream] = most
	}
	return most, most > 0 && StoredSize(m) > most
}

// MaxBytesRefused reports whether err is a stream's "maximum bytes
// exceeded": TooLarge's question.
func MaxBytesRefused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStoreFailed && apiErr.Description == descMaxBytes
}

// StoredSize is about what a stream's store counts for m: its subject,
// headers and data, and a record's overhead (the file store's 30 bytes, as
// nats-server 2.10 and later check it; a message within a few dozen bytes
// of MaxBytes may be judged either way on other versions).
func StoredSize(m *nats.Msg) int64 {
	return int64(len(m.Subject)) + 30 + PayloadSize(m)
}

// PayloadSize is what nats.go holds against the server's max_payload: the
// data and the headers as they go on the wire ("NATS/1.0", a "key: value"
// line per value, trimmed of spaces as nats.go writes it, a blank line).
func PayloadSize(m *nats.Msg) int64 {
	n := int64(len(m.Data))
	if len(m.Header) > 0 {
		n += int64(len("NATS/1.0\r\n\r\n"))
	}
	for k, vs := range m.Header {
		for _, v := range vs {
			n += int64(len(k) + len(textproto.TrimString(v)) + 4)
		}
	}
	return n
}
