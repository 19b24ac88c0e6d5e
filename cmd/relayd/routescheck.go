package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

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

// routesCommand is relayd routes: its one action is check.
type routesCommand struct{ *cli }

func (c *routesCommand) Usage() string { return (&routesCheckCommand{}).Usage() }

func (c *routesCommand) action(name string) (command, bool) {
	if name == "check" {
		return &routesCheckCommand{cli: c.cli}, true
	}
	return nil, false
}

func (c *routesCommand) Run(ctx context.Context, args []string) error {
	check := &routesCheckCommand{cli: c.cli}
	fs := check.flags()
	action, args := takeAction(args, fs)
	switch action {
	case "check":
		return within("routes check", check, check.Run(ctx, args))
	case "":
		// The help, or a usage error for a flag.
		if err := parseFlags(fs, args); err != nil {
			return within("routes check", check, err)
		}
	}
	return usagef("want check (see relayd routes --help)")
}

// routesCheckCommand is relayd routes check.
type routesCheckCommand struct {
	*cli
	asJSON         bool
	connectTimeout time.Duration
}

func (c *routesCheckCommand) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("routes check", flag.ContinueOnError)
	fs.BoolVar(&c.asJSON, "json", false, "one JSON document, for scripts")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *routesCheckCommand) Usage() string { return withFlagDefaults(c.flags(), routesHelp) }

func (c *routesCheckCommand) Run(ctx context.Context, args []string) error {
	if err := parseFlags(c.flags(), args); err != nil {
		return err
	}
	if err := checkConnectTimeout(c.connectTimeout); err != nil {
		return err
	}
	cfg, err := c.config(noDatabase{c.env})
	if err != nil {
		return err
	}
	log := c.log
	// Each broker gets the connect timeout, and then a few seconds to answer.
	cfg.StartupTimeout = c.connectTimeout
	ctx, cancel := context.WithTimeout(ctx, 2*c.connectTimeout+10*time.Second)
	defer cancel()

	report := routesReport{Problems: []routeProblem{}}
	for _, r := range cfg.routes.Routes() {
		report.Routes = append(report.Routes, r.Spec())
	}
	report.Routes = append(report.Routes, cfg.routes.DefaultSpec())
	// A broker that could not be checked: failed, and a line that says why
	// when it did not answer (other failures are logged).
	failed, down := false, []error{}
	if cfg.wants(relay.TargetAMQP) {
		tlsCfg, err := cfg.amqpTLS()
		if err == nil {
			if downErr := amqpAnswers(cfg, tlsCfg, c.connectTimeout); downErr != nil {
				failed, down = true, append(down, downErr)
			} else {
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
		}
		if err != nil {
			log.Error("routes check: rabbitmq", "error", err.Error())
			failed = true
		}
	}
	if cfg.wants(relay.TargetNATS) {
		nc, err := dialNATS(ctx, cfg, log, slog.New(slog.DiscardHandler))
		if err != nil {
			failed, down, err = true, append(down, errors.New(natsFailure(cfg, err))), nil
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
	if c.asJSON {
		printJSON(c.stdout, report) //nolint:errcheck // the exit status says what the report does
	} else {
		printRoutes(c.stdout, report, failed)
	}
	switch {
	case len(down) > 0:
		return errors.Join(down...) // a line each
	case failed || len(report.Problems) > 0:
		return errReported
	}
	return nil
}

// amqpAnswers says whether RabbitMQ takes a connection, within timeout:
// nil, or the one line that says it did not.
func amqpAnswers(cfg *config, tlsCfg *tls.Config, timeout time.Duration) error {
	conn, err := amqpio.DialURL(cfg.AMQPURL, amqpio.DialOptions{TLS: tlsCfg, Name: "relayd routes check", Timeout: timeout})
	if err != nil {
		return errors.New(amqpFailure(cfg, 0, err))
	}
	conn.Close()
	return nil
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
