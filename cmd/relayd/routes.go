package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/natssink"
)

// The start-up checks of RELAY_ROUTES against the brokers. What a route
// points at that a broker lacks is logged, route by route, and the relay
// starts anyway: the operator can create it, and meanwhile that route's
// rows wait (a missing exchange or stream) or are retried (a subject no
// stream captures), named again as they do.

// checkAMQPRoutes logs each route whose exchange RabbitMQ lacks. A
// templated exchange is checked as its rows go.
func checkAMQPRoutes(ctx context.Context, cfg *config, tlsCfg *tls.Config, log *slog.Logger) {
	var names []string
	byName := map[string][]string{}
	for _, r := range cfg.routes.Routes() {
		name, templated := r.Exchange()
		if templated || name == "" || name == cfg.AMQPExchange {
			continue
		}
		if byName[name] == nil {
			names = append(names, name)
		}
		byName[name] = append(byName[name], r.Name)
	}
	missing, err := amqpsink.MissingExchanges(ctx, cfg.AMQPURL, tlsCfg, names)
	if err != nil {
		log.Warn("amqp: could not check the routes' exchanges; they are checked as rows go", "error", err.Error())
	}
	for _, name := range missing {
		log.Warn("amqp: RabbitMQ has no exchange "+name+", which routes name: their rows wait until it exists. Declare it, or fix the routes",
			"exchange", name, "routes", byName[name])
	}
}

// checkNATSRoutes logs each route whose subjects no stream captures (or not
// the stream it names), and returns the shortest duplicate window of the
// streams the routes use (0: none found), which bounds the retries of a
// publish whose outcome is unknown.
func checkNATSRoutes(ctx context.Context, cfg *config, nc *nats.Conn, log *slog.Logger) time.Duration {
	routes := cfg.routes.Routes()
	if len(routes) == 0 {
		return 0
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return 0
	}
	var streams []*jetstream.StreamConfig
	list := js.ListStreams(ctx)
	for info := range list.Info() {
		streams = append(streams, &info.Config)
	}
	if err := list.Err(); err != nil {
		log.Warn("nats: could not list the streams to check the routes; their subjects are checked as rows go", "error", err.Error())
		return 0
	}
	var window time.Duration
	use := func(s *jetstream.StreamConfig) {
		if window == 0 || s.Duplicates < window {
			window = s.Duplicates
		}
	}
	for _, r := range routes {
		filter := r.SubjectFilter()
		captures := func(s *jetstream.StreamConfig) bool {
			return slices.ContainsFunc(s.Subjects, func(f string) bool { return natssink.Covers(f, filter) })
		}
		if name := r.Stream(); name != "" {
			i := slices.IndexFunc(streams, func(s *jetstream.StreamConfig) bool { return s.Name == name })
			switch {
			case i < 0:
				log.Warn("nats: route "+r.Name+" names stream "+name+", which does not exist: its rows wait until it does. Create it, or fix the route",
					"route", r.Name, "stream", name)
			case !captures(streams[i]):
				use(streams[i])
				log.Warn("nats: stream "+name+" does not capture all of route "+r.Name+"'s subjects: a row outside them is retried, and parked when its attempts run out",
					"route", r.Name, "stream", name, "subjects", filter, "stream_subjects", streams[i].Subjects)
			default:
				use(streams[i])
			}
			continue
		}
		if i := slices.IndexFunc(streams, captures); i >= 0 {
			use(streams[i])
			continue
		}
		log.Warn("nats: no stream captures all of route "+r.Name+"'s subjects: a row outside them is retried, and parked when its attempts run out",
			"route", r.Name, "subjects", filter)
	}
	return window
}
