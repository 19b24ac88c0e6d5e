package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/relayd/relayd/internal/cutover"
)

// groupsFlag is the consumer groups the cutover check takes, from
// --dual-read, --rolling-upgrade and --consumer, in the order given. A
// group's Stream is "" until resolve gives it the default.
type groupsFlag []cutover.Group

// groupPath is one of the repeatable group flags: each use adds a group
// that moves on its path.
type groupPath struct {
	groups *groupsFlag
	path   cutover.Path
}

func (f groupPath) String() string { return "" }

// IsList marks a flag meant to repeat.
func (f groupPath) IsList() bool { return true }

// Set parses [STREAM/]DURABLE[:QUEUE]. JetStream names cannot hold '/', so
// the first '/' before the first ':' splits the stream off; the queue, after
// that ':', may hold anything, ':' included.
func (f groupPath) Set(spec string) error {
	var g cutover.Group
	name, queue, hasQueue := strings.Cut(spec, ":")
	if hasQueue {
		if queue == "" {
			return fmt.Errorf("%q: the queue after ':' is empty", spec)
		}
		g.Queue = queue
	}
	if stream, durable, ok := strings.Cut(name, "/"); ok {
		if !validNATSName(stream) {
			return fmt.Errorf("%q: %q is not a valid stream name", spec, stream)
		}
		g.Stream, g.Label, name = stream, name, durable
	}
	if !validNATSName(name) {
		return fmt.Errorf("%q: want [STREAM/]DURABLE[:QUEUE], and %q is not a valid consumer name", spec, name)
	}
	g.Consumer, g.Path = name, f.path
	*f.groups = append(*f.groups, g)
	return nil
}

// validNATSName: JetStream names cannot be empty or hold whitespace, '.',
// '*', '>' or a path separator.
func validNATSName(s string) bool {
	return s != "" && !strings.ContainsAny(s, " \t\r\n.*>/\\")
}

// withQueue says whether a group names a legacy queue: the check then
// needs RabbitMQ.
func (gs groupsFlag) withQueue() bool {
	for _, g := range gs {
		if g.Queue != "" {
			return true
		}
	}
	return false
}

// unique refuses a consumer named twice: one group, one path.
func (gs groupsFlag) unique() error {
	seen := map[string]bool{}
	for _, g := range gs {
		k := g.Stream + "/" + g.Consumer
		if seen[k] {
			return fmt.Errorf("consumer %s is named twice: give each group once, with its path", g.Consumer)
		}
		seen[k] = true
	}
	return nil
}

// resolve gives the groups that name no stream the default one.
func (gs groupsFlag) resolve(stream string) ([]cutover.Group, error) {
	out := make([]cutover.Group, len(gs))
	for i, g := range gs {
		if g.Stream == "" {
			if stream == "" {
				return nil, errors.New("group " + g.Consumer + " names no stream, and neither --stream nor RELAY_NATS_STREAM does: give it as STREAM/" + g.Consumer)
			}
			g.Stream = stream
		}
		out[i] = g
	}
	if err := groupsFlag(out).unique(); err != nil {
		return nil, err
	}
	return out, nil
}

// namesFlag is a repeatable flag of consumer names (--exclude).
type namesFlag []string

func (f *namesFlag) String() string { return strings.Join(*f, ",") }

// IsList marks a flag meant to repeat.
func (f *namesFlag) IsList() bool { return true }

func (f *namesFlag) Set(name string) error {
	if !validNATSName(name) {
		return fmt.Errorf("%q is not a valid consumer name", name)
	}
	*f = append(*f, name)
	return nil
}
