package natssink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream is what EnsureStream found.
type Stream struct {
	DuplicateWindow time.Duration
	Warning         string // "" when its subjects capture all of PREFIX>
}

// EnsureStream checks that the stream exists, or with create makes it
// (file storage on prefix+">", the given duplicate window). A missing
// stream is reported by name. A stream that exists is left as it is, create
// or not: its limits, duplicate window and subjects are the operator's (an
// update would put every setting not given here back to its default). It
// returns the stream's duplicate window (Config.DuplicateWindow), and a
// warning when the stream's subjects do not capture all of prefix+">":
// rows of the topics outside them are refused.
func EnsureStream(ctx context.Context, nc *nats.Conn, name, subjectPrefix string, dupWindow time.Duration, create bool) (Stream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return Stream{}, err
	}
	subject := subjectPrefix + ">"
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) && create {
		if subjectPrefix == "" {
			return Stream{}, errors.New("nats: provisioning a stream needs RELAY_NATS_SUBJECT_PREFIX (its subjects are PREFIX>)")
		}
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:       name,
			Subjects:   []string{subject},
			Storage:    jetstream.FileStorage,
			Duplicates: dupWindow,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, err = js.Stream(ctx, name) // another instance made it meanwhile
		}
		if err != nil {
			return Stream{}, fmt.Errorf("nats: create stream %q: %w", name, err)
		}
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Stream{}, fmt.Errorf("nats: stream %q does not exist (create it, or set RELAY_PROVISION=true)", name)
	}
	if err != nil {
		return Stream{}, fmt.Errorf("nats: check stream %q: %w", name, err)
	}
	c := st.CachedInfo().Config
	found := Stream{DuplicateWindow: c.Duplicates}
	if !slices.ContainsFunc(c.Subjects, func(f string) bool { return Covers(f, subject) }) {
		found.Warning = fmt.Sprintf("stream %q's subjects %q do not capture all of %q: a row whose subject falls outside them is retried, and parked when its attempts run out (no stream, or another stream, captures it)", name, c.Subjects, subject)
	}
	return found, nil
}

// Covers reports whether the subject filter captures every subject that
// subject (itself a filter, with wildcards) matches.
func Covers(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, ft := range f {
		if ft == ">" {
			return i < len(s)
		}
		if i >= len(s) || s[i] == ">" {
			return false
		}
		if ft != "*" && (ft != s[i] || s[i] == "*") {
			return false
		}
	}
	return len(f) == len(s)
}
