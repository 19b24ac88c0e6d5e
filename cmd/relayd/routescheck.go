package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/natssink"
	"github.com/relayd/relayd/route"
)

const routesHelp = `Usage: relayd routes check [--json] [--connect-timeout D]

Lists the routes of RELAY_ROUTES in the order they are tried, then the
default route, with their defaults filled in, and checks what they point at
against the live brokers: RabbitMQ has each exchange a route names (one
without placeholders: those are checked as rows go), and a stream captures
each route's subjects (the stream the route names, when it names one).
relayd run logs the same at start, and starts anyway.
Uses RELAY_ROUTES and the broker settings (RELAY_AMQP_*, RELAY_NATS_*); not
the database. Exit status: 0 everything the routes point at exists, 1
something is missing or a broker did not answer, 2 bad usage or a bad file.

  --json                one JSON document, for scripts
` + connectTimeoutHelp

// routesReport is what routes check prints.
type routesReport struct {
	Routes   []route.Spec   `json:"routes"`
	Problems []routeProblem `json:"problems"`
}

func cmdRoutes(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	if len(args) == 0 || args[0] != "check" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "-help") {
			fmt.Fprint(stdout, routesHelp)
			return exitOK
		}
		fmt.Fprintf(stderr, "relayd routes: want check (see relayd routes --help)\n")
		return exitUsage
	}
	fs := flag.NewFlagSet("routes check", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args[1:], stdout, stderr, routesHelp); done {
		return code
	}
	if !checkConnectTimeout("routes check", *connectTimeout, stderr) {
		return exitUsage
	}
	cfg, code := configOrExit(stderr, noDatabase{env})
	if cfg == nil {
		return code
	}
	log := newLogger(cfg, stderr)
	// Each broker gets the connect timeout, and then a few seconds to answer.
	cfg.StartupTimeout = *connectTimeout
	ctx, cancel := context.WithTimeout(context.Background(), 2*(*connectTimeout)+10*time.Second)
	defer cancel()

	report := routesReport{Problems: []routeProblem{}}
	for _, r := range cfg.routes.Routes() {
		report.Routes = append(report.Routes, r.Spec())
	}
	report.Routes = append(report.Routes, cfg.routes.DefaultSpec())
	failed := false
	if cfg.wants(relay.TargetAMQP) {
		tlsCfg, err := cfg.amqpTLS()
		if err == nil {
			var problems []routeProblem
			problems, err = amqpRouteProblems(ctx, cfg, tlsCfg)
			report.Problems = append(report.Problems, problems...)
			if err == nil { // the default route's, which relayd run checks apart
				var missing []string
				missing, err = amqpsink.MissingExchanges(ctx, cfg.AMQPURL, tlsCfg, []string{cfg.AMQPExchange})
				if len(missing) > 0 {
					report.Problems = append(report.Problems, routeProblem{Route: "(default)", Broker: "amqp",
						Problem: "RabbitMQ has no exchange " + cfg.AMQPExchange + " (RELAY_AMQP_EXCHANGE): relayd run refuses to start"})
				}
			}
		}
		if err != nil {
			log.Error("routes check: rabbitmq", "error", err.Error())
			failed = true
		}
	}
	if cfg.wants(relay.TargetNATS) {
		nc, err := connectNATS(ctx, cfg, log)
		if err == nil {
			var problems []routeProblem
			problems, _, err = natsRouteProblems(ctx, cfg, nc)
			report.Problems = append(report.Problems, problems...)
			if err == nil && cfg.NATSStream != "" { // the default route's, which relayd run checks apart
				var found natssink.Stream
				found, err = natssink.EnsureStream(ctx, nc, cfg.NATSStream, cfg.NATSSubjectPrefix, cfg.NATSDupWindow, false)
				switch {
				case err != nil && strings.Contains(err.Error(), "does not exist"):
					report.Problems = append(report.Problems, routeProblem{Route: "(default)", Broker: "nats",
						Problem: "JetStream has no stream " + cfg.NATSStream + " (RELAY_NATS_STREAM): relayd run refuses to start"})
					err = nil
				case found.Warning != "":
					report.Problems = append(report.Problems, routeProblem{Route: "(default)", Broker: "nats", Problem: found.Warning})
				}
			}
			nc.Close()
		}
		if err != nil {
			log.Error("routes check: nats", "error", err.Error())
			failed = true
		}
	}
	if *asJSON {
		printJSON(stdout, report)
	} else {
		printRoutes(stdout, report)
	}
	if failed || len(report.Problems) > 0 {
		return exitFailure
	}
	return exitOK
}

func printRoutes(w io.Writer, r routesReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tTOPIC\tHEADERS\tEXCHANGE\tROUTING KEY\tSUBJECT\tSTREAM")
	for _, s := range r.Routes {
		var h []string
		for k, v := range s.Headers {
			h = append(h, k+"="+v)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%q\t%q\t%s\t%s\n", s.Name, s.Topic, strings.Join(h, ","), s.Exchange, s.RoutingKey, s.Subject, orAny(s.Stream))
	}
	tw.Flush()
	if len(r.Problems) == 0 {
		fmt.Fprintln(w, "\nevery exchange and stream the routes name exists, and streams capture their subjects")
		return
	}
	fmt.Fprintln(w)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "%s (%s): %s\n", p.Route, p.Broker, p.Problem)
	}
}

func orAny(stream string) string {
	if stream == "" {
		return "(any)"
	}
	return stream
}
