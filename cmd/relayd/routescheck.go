package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/natssink"
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

Flags:
`

// routesReport is what routes check prints.
type routesReport struct {
	Routes   []route.Spec   `json:"routes"`
	Problems []routeProblem `json:"problems"`
}

func cmdRoutes(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("routes check", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "one JSON document, for scripts")
	connectTimeout := connectTimeoutFlag(fs)
	help := withFlagDefaults(fs, routesHelp)
	action, args := takeAction(args, fs)
	if action != "check" {
		if action == "" {
			// The help, or a usage error for a flag.
			if code, done := parseFlags(fs, args, stdout, stderr, help); done {
				return code
			}
		}
		fmt.Fprintf(stderr, "relayd routes: want check (see relayd routes --help)\n")
		return exitUsage
	}
	if code, done := parseFlags(fs, args, stdout, stderr, help); done {
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
		if err == nil && !amqpAnswers(cfg, tlsCfg, *connectTimeout, stderr) {
			failed = true
		} else if err == nil {
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
		nc, err := dialNATS(ctx, cfg, log, slog.New(slog.DiscardHandler))
		if err != nil {
			fmt.Fprintln(stderr, commandPrefix("routes check")+natsFailure(cfg, err))
			failed, err = true, nil
		} else {
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
		printRoutes(stdout, report, failed)
	}
	if failed || len(report.Problems) > 0 {
		return exitFailure
	}
	return exitOK
}

// amqpAnswers says whether RabbitMQ takes a connection, within timeout;
// when not, it has printed the one line that says so.
func amqpAnswers(cfg *config, tlsCfg *tls.Config, timeout time.Duration, stderr io.Writer) bool {
	conn, err := amqpio.DialURL(cfg.AMQPURL, amqpio.DialOptions{TLS: tlsCfg, Name: "relayd routes check", Timeout: timeout})
	if err != nil {
		fmt.Fprintln(stderr, commandPrefix("routes check")+amqpFailure(cfg, 0, err))
		return false
	}
	conn.Close()
	return true
}

// printRoutes writes the routes and their problems; failed: a broker could
// not be checked (said on stderr).
func printRoutes(w io.Writer, r routesReport, failed bool) {
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
	switch {
	case len(r.Problems) == 0 && failed:
		fmt.Fprintln(w, "\nnot checked against every broker: one did not answer")
		return
	case len(r.Problems) == 0:
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
