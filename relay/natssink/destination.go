package natssink

import "github.com/relayd/relayd/relay"

var _ relay.Destinationer = (*Sink)(nil)

// Destination implements relay.Destinationer: the subject a topic is
// published on.
func (s *Sink) Destination(topic string) string { return s.Subject(topic) }
