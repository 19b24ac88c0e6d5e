package amqpsink

import "github.com/relayd/relayd/relay"

var _ relay.Destinationer = (*Sink)(nil)

// Destination implements relay.Destinationer: the exchange.
func (s *Sink) Destination(m *relay.Message) string {
	exchange, _ := s.dest(m)
	return exchange
}

// dest is where m goes: its route's exchange and routing key, or the
// configured exchange and the topic.
func (s *Sink) dest(m *relay.Message) (exchange, routingKey string) {
	if r := m.Route; r != nil {
		return r.Exchange, r.RoutingKey
	}
	return s.cfg.Exchange, m.Topic
}

// routedExchanges are the exchanges msgs' routes name other than the
// configured one (checked at start) and the default exchange (always there).
func (s *Sink) routedExchanges(msgs []*relay.Message) map[string]struct{} {
	var out map[string]struct{}
	for _, m := range msgs {
		if r := m.Route; r != nil && r.Exchange != "" && r.Exchange != s.cfg.Exchange {
			if out == nil {
				out = map[string]struct{}{}
			}
			out[r.Exchange] = struct{}{}
		}
	}
	return out
}
