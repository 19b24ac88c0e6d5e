package natssink

import "github.com/relayd/relayd/relay"

var _ relay.Destinationer = (*Sink)(nil)

// Destination implements relay.Destinationer: the subject.
func (s *Sink) Destination(m *relay.Message) string { return s.subject(m) }

// subject is the subject m is published on: its route's, or the prefix and
// the topic.
func (s *Sink) subject(m *relay.Message) string {
	if r := m.Route; r != nil {
		return r.Subject
	}
	return s.Subject(m.Topic)
}

// stream is the stream m must be stored in (Nats-Expected-Stream): its
// route's, or the configured one; "": any that captures its subject.
func (s *Sink) stream(m *relay.Message) string {
	if r := m.Route; r != nil && r.Stream != "" {
		return r.Stream
	}
	return s.cfg.Stream
}
