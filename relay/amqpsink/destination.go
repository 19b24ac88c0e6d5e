package amqpsink

import "github.com/relayd/relayd/relay"

var _ relay.Destinationer = (*Sink)(nil)

// Destination implements relay.Destinationer: the exchange, whatever the
// topic (the routing key).
func (s *Sink) Destination(string) string { return s.cfg.Exchange }
