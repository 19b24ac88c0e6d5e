package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayd/relayd/relay"
)

const outboxHelp = `Usage:
  relayd outbox parked [--target amqp|nats] [--limit N] [--json] [--connect-timeout D]
  relayd outbox retry (--id N[,N...] | --all) [--target amqp|nats] [--json] [--connect-timeout D]

parked lists rows that will not be retried without an operator, with the
reason per target. retry puts them back in line (attempts start again from 0)
once the cause is fixed. Both are safe while relays run. Without --target,
every target (the shell's RELAY_TARGETS is not read). Needs
RELAY_DATABASE_URL and RELAY_OUTBOX_TABLE.

Flags: each action has its own; relayd outbox parked --help and relayd
outbox retry --help list them.
`

const outboxParkedHelp = `Usage: relayd outbox parked [--target amqp|nats] [--limit N] [--json] [--connect-timeout D]

Lists rows that will not be retried without an operator, with the reason per
target, oldest first. Safe while relays run.

Flags:
`

const outboxRetryHelp = `Usage: relayd outbox retry (--id N[,N...] | --all) [--target amqp|nats] [--json] [--connect-timeout D]

Puts parked rows back in line, their attempts started again from 0, once the
cause is fixed. Safe while relays run.

Flags:
`

// outboxCommand is relayd outbox: its actions parked and retry are
// commands of their own.
type outboxCommand struct{ *cli }

func (c *outboxCommand) Usage() string { return outboxHelp }

func (c *outboxCommand) action(name string) (command, bool) {
	switch name {
	case "parked":
		return &outboxParkedCommand{cli: c.cli}, true
	case "retry":
		return &outboxRetryCommand{cli: c.cli}, true
	}
	return nil, false
}

func (c *outboxCommand) Run(ctx context.Context, args []string) error {
	parked, retry := &outboxParkedCommand{cli: c.cli}, &outboxRetryCommand{cli: c.cli}
	action, args := takeAction(args, parked.flags(), retry.flags())
	switch action {
	case "parked":
		return within("outbox parked", parked, parked.Run(ctx, args))
	case "retry":
		return within("outbox retry", retry, retry.Run(ctx, args))
	case "":
		if len(args) == 1 && aliases[args[0]] == "help" {
			return flag.ErrHelp
		}
		return errNoAction
	}
	return usagef("unknown action %q: want parked or retry (see relayd outbox --help)", action)
}

// outboxFlags are the flags outbox parked and outbox retry share, and
// their own.
type outboxFlags struct {
	target, idList string
	limit          int
	all, asJSON    bool
	connectTimeout time.Duration
}

// outboxParkedCommand is relayd outbox parked.
type outboxParkedCommand struct {
	*cli
	outboxFlags
}

func (c *outboxParkedCommand) flags() *flag.FlagSet {
	f := &c.outboxFlags
	fs := flag.NewFlagSet("outbox parked", flag.ContinueOnError)
	fs.StringVar(&f.target, "target", "", "amqp or nats (default: every target)")
	fs.IntVar(&f.limit, "limit", 1000, "list at most N rows")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *outboxParkedCommand) Usage() string { return withFlagDefaults(c.flags(), outboxParkedHelp) }

// outboxRetryCommand is relayd outbox retry.
type outboxRetryCommand struct {
	*cli
	outboxFlags
}

func (c *outboxRetryCommand) flags() *flag.FlagSet {
	f := &c.outboxFlags
	fs := flag.NewFlagSet("outbox retry", flag.ContinueOnError)
	fs.StringVar(&f.idList, "id", "", "the rows to retry, by id: N[,N...]")
	fs.BoolVar(&f.all, "all", false, "retry every parked row")
	fs.StringVar(&f.target, "target", "", "amqp or nats (default: every target)")
	fs.BoolVar(&f.asJSON, "json", false, `print {"retried": N}`)
	fs.DurationVar(&f.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *outboxRetryCommand) Usage() string { return withFlagDefaults(c.flags(), outboxRetryHelp) }

// open reads the actions' shared flags and opens their session.
func (f *outboxFlags) open(ctx context.Context, c *cli) ([]relay.Target, *session, error) {
	targets, err := parseTarget(f.target)
	if err != nil {
		return nil, nil, err
	}
	if err := checkConnectTimeout(f.connectTimeout); err != nil {
		return nil, nil, err
	}
	ss, err := openSession(ctx, c, sessionOptions{Conns: readerConns, ConnectTimeout: f.connectTimeout})
	return targets, ss, err
}

// parseTarget reads --target: one target, or every one when not given.
func parseTarget(s string) ([]relay.Target, error) {
	if s == "" {
		return slices.Clone(relay.Targets), nil
	}
	t, err := relay.ParseTargets(s)
	if err != nil || len(t) != 1 {
		return nil, usagef("--target: want amqp or nats")
	}
	return t, nil
}

func (c *outboxParkedCommand) Run(ctx context.Context, args []string) error {
	if err := parseFlags(c.flags(), args); err != nil {
		return err
	}
	if c.limit < 1 {
		return usagef("--limit must be positive")
	}
	targets, ss, err := c.open(ctx, c.cli)
	if err != nil {
		return err
	}
	defer ss.close()
	rows, err := relay.ListParked(ss.ctx, ss.pool, ss.cfg.table, targets, c.limit)
	if err != nil {
		return logged("outbox parked", err)
	}
	if c.asJSON {
		if rows == nil {
			rows = []relay.ParkedRow{}
		}
		return printJSON(c.stdout, rows)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMESSAGE ID\tTOPIC\tTARGET\tPARKED AT\tATTEMPTS\tREASON")
	for _, r := range rows {
		for _, pt := range r.Targets {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.MessageID, r.Topic, pt.Target, pt.ParkedAt.Format(time.RFC3339), pt.Attempts, pt.Reason)
		}
	}
	tw.Flush()
	if len(rows) == c.limit {
		fmt.Fprintf(c.stdout, "(first %d rows; --limit for more)\n", c.limit)
	}
	return nil
}

func (c *outboxRetryCommand) Run(ctx context.Context, args []string) error {
	if err := parseFlags(c.flags(), args); err != nil {
		return err
	}
	var ids []int64
	if c.idList != "" {
		for _, s := range strings.Split(c.idList, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return usagef("--id: %q is not a row id", s)
			}
			ids = append(ids, id)
		}
	}
	if (len(ids) == 0) == !c.all {
		return usagef("give --id N[,N...] or --all (one of them)")
	}
	targets, ss, err := c.open(ctx, c.cli)
	if err != nil {
		return err
	}
	defer ss.close()
	which := relay.ParkedIDs(ids...)
	if c.all {
		which = relay.AllParked()
	}
	n, err := relay.RetryParked(ss.ctx, ss.pool, ss.cfg.table, targets, which)
	if err != nil {
		return logged("outbox retry", err)
	}
	if c.asJSON {
		return printJSON(c.stdout, map[string]int64{"retried": n})
	}
	fmt.Fprintf(c.stdout, "%d parked delivery(ies) put back in line\n", n)
	return nil
}
