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

// The checks of RELAY_ROUTES against the brokers, at start and by `relayd
// routes check`. What a route points at that a broker lacks is the
// operator's to create: relayd starts anyway, and meanwhile that route's
// rows wait (a missing exchange or stream) or are retried (a subject no
// stream captures), named again as they do.

// routeProblem is one thing a route points at that a broker lacks.
type routeProblem struct {
	Route   string `json:"route"`
	Broker  string `json:"broker"` // "amqp" or "nats"
	Problem string `json:"problem"`
}

// amqpRouteProblems are the routes whose exchange RabbitMQ lacks. A
// templated exchange is checked as its rows go.
func amqpRouteProblems(ctx context.Context, cfg *config, tlsCfg *tls.Config) ([]routeProblem, error) {
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
	var out []routeProblem
	for _, name := range missing {
		for _, r := range byName[name] {
			out = append(out, routeProblem{Route: r, Broker: "amqp", Problem: "RabbitMQ has no exchange " + name + ": the route's rows wait until it exists"})
		}
	}
	return out, err
}

// natsRouteProblems are the routes whose subjects no stream captures (or
// not the stream they name), and the shortest duplicate window of the
// streams the routes use (0: none found), which bounds the retries of a
// publish whose outcome is unknown.
func natsRouteProblems(ctx context.Context, cfg *config, nc *nats.Conn) ([]routeProblem, time.Duration, error) {
	routes := cfg.routes.Routes()
	if len(routes) == 0 {
		return nil, 0, nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, 0, err
	}
	var streams []*jetstream.StreamConfig
	list := js.ListStreams(ctx)
	for info := range list.Info() {
		streams = append(streams, &info.Config)
	}
	if err := list.Err(); err != nil {
		return nil, 0, err
	}
	var window time.Duration
	use := func(s *jetstream.StreamConfig) {
		if window == 0 || s.Duplicates < window {
			window = s.Duplicates
		}
	}
	var out []routeProblem
	for _, r := range routes {
		filter := r.SubjectFilter()
		captures := func(s *jetstream.StreamConfig) bool {
			return slices.ContainsFunc(s.Subjects, func(f string) bool { return natssink.Covers(f, filter) })
		}
		problem := ""
		if name := r.Stream(); name != "" {
			switch i := slices.IndexFunc(streams, func(s *jetstream.StreamConfig) bool { return s.Name == name }); {
			case i < 0:
				problem = "JetStream has no stream " + name + ": the route's rows wait until it exists"
			case !captures(streams[i]) && name == cfg.NATSStream:
				use(streams[i])
				problem = "stream " + name + " (RELAY_NATS_STREAM) does not capture all of " + filter + ": a row outside its subjects is retried, and parked when its attempts run out"
			case !captures(streams[i]):
				use(streams[i])
				problem = "stream " + name + " does not capture all of " + filter + ": the route's rows outside its subjects wait until it does"
			default:
				use(streams[i])
			}
		} else if i := slices.IndexFunc(streams, captures); i >= 0 {
			use(streams[i])
		} else {
			problem = "no stream captures all of " + filter + ": a row outside them is retried, and parked when its attempts run out"
		}
		if problem != "" {
			out = append(out, routeProblem{Route: r.Name, Broker: "nats", Problem: problem})
		}
	}
	return out, window, nil
}

// checkAMQPRoutes logs, at start, each route whose exchange RabbitMQ lacks.
func checkAMQPRoutes(ctx context.Context, cfg *config, tlsCfg *tls.Config, log *slog.Logger) {
	problems, err := amqpRouteProblems(ctx, cfg, tlsCfg)
	if err != nil {
		log.Warn("amqp: could not check the routes' exchanges; they are checked as rows go", "error", err.Error())
	}
	for _, p := range problems {
		log.Warn("amqp: route "+p.Route+": "+p.Problem+". Declare it, or fix the route", "route", p.Route)
	}
}

// checkNATSRoutes logs, at start, each route whose subjects no stream
// captures, and returns natsRouteProblems' duplicate window.
func checkNATSRoutes(ctx context.Context, cfg *config, nc *nats.Conn, log *slog.Logger) time.Duration {
	problems, window, err := natsRouteProblems(ctx, cfg, nc)
	if err != nil {
		log.Warn("nats: could not list the streams to check the routes; their subjects are checked as rows go", "error", err.Error())
	}
	for _, p := range problems {
		log.Warn("nats: route "+p.Route+": "+p.Problem, "route", p.Route)
	}
	return window
}

// routeStreams are the streams the routes name beside RELAY_NATS_STREAM,
// each once, in the routes' order.
func routeStreams(cfg *config) []string {
	var out []string
	for _, r := range cfg.routes.Routes() {
		if s := r.Stream(); s != "" && s != cfg.NATSStream && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
