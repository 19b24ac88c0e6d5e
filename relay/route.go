package relay

import "github.com/relayd/relayd/internal/route"

// routeRows gives each row not routed before the route Config.Routes
// resolves for it; a row the owed table holds a route for keeps that one,
// so that both brokers and every retry get it the same way.
func (r *Relay) routeRows(rows []*claimed) {
	if r.cfg.Routes == nil {
		return
	}
	dests := make([]route.Dest, len(rows))
	for i, c := range rows {
		if c.msg.Route != nil || c.badRow != "" {
			continue
		}
		dests[i], _ = r.cfg.Routes.Resolve(c.msg.Topic, c.msg.Headers)
		c.msg.Route = &dests[i]
	}
}
