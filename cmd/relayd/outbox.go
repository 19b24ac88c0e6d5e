package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sethvargo/go-envconfig"

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

func cmdOutbox(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	parked, parkedArgs := outboxParkedFlags()
	retry, retryArgs := outboxRetryFlags()
	action, args := takeAction(args, parked, retry)
	switch action {
	case "parked":
		return cmdOutboxParked(parked, parkedArgs, args, stdout, stderr, env)
	case "retry":
		return cmdOutboxRetry(retry, retryArgs, args, stdout, stderr, env)
	case "":
		if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			fmt.Fprint(stdout, outboxHelp)
			return exitOK
		}
		fmt.Fprint(stderr, outboxHelp)
	default:
		fmt.Fprintf(stderr, "relayd outbox: unknown action %q: want parked or retry (see relayd outbox --help)\n", action)
	}
	return exitUsage
}

// outboxFlags are the flags outbox parked and outbox retry share, and
// their own.
type outboxFlags struct {
	target, idList string
	limit          int
	all, asJSON    bool
	connectTimeout time.Duration
}

func outboxParkedFlags() (*flag.FlagSet, *outboxFlags) {
	var f outboxFlags
	fs := flag.NewFlagSet("outbox parked", flag.ContinueOnError)
	fs.StringVar(&f.target, "target", "", "amqp or nats (default: every target)")
	fs.IntVar(&f.limit, "limit", 1000, "list at most N rows")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs, &f
}

func outboxRetryFlags() (*flag.FlagSet, *outboxFlags) {
	var f outboxFlags
	fs := flag.NewFlagSet("outbox retry", flag.ContinueOnError)
	fs.StringVar(&f.idList, "id", "", "the rows to retry, by id: N[,N...]")
	fs.BoolVar(&f.all, "all", false, "retry every parked row")
	fs.StringVar(&f.target, "target", "", "amqp or nats (default: every target)")
	fs.BoolVar(&f.asJSON, "json", false, `print {"retried": N}`)
	fs.DurationVar(&f.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs, &f
}

// parseTarget reads --target: one target, or every one when not given.
func parseTarget(name, s string, stderr io.Writer) ([]relay.Target, bool) {
	if s == "" {
		return slices.Clone(relay.Targets), true
	}
	t, err := relay.ParseTargets(s)
	if err != nil || len(t) != 1 {
		fmt.Fprintf(stderr, "relayd %s: --target: want amqp or nats\n", name)
		return nil, false
	}
	return t, true
}

func cmdOutboxParked(fs *flag.FlagSet, f *outboxFlags, args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, outboxParkedHelp)); done {
		return code
	}
	if f.limit < 1 {
		fmt.Fprintln(stderr, "relayd outbox parked: --limit must be positive")
		return exitUsage
	}
	targets, ok := parseTarget(fs.Name(), f.target, stderr)
	if !ok || !checkConnectTimeout(fs.Name(), f.connectTimeout, stderr) {
		return exitUsage
	}
	ss, code := connectSession(fs.Name(), stderr, env, 2, false, f.connectTimeout)
	if ss == nil {
		return code
	}
	defer ss.close()
	rows, err := relay.ListParked(ss.ctx, ss.pool, ss.cfg.table, targets, f.limit)
	if err != nil {
		ss.log.Error("outbox parked", "error", err.Error())
		return exitFailure
	}
	if f.asJSON {
		if rows == nil {
			rows = []relay.ParkedRow{}
		}
		return printJSON(stdout, rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMESSAGE ID\tTOPIC\tTARGET\tPARKED AT\tATTEMPTS\tREASON")
	for _, r := range rows {
		for _, pt := range r.Targets {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.MessageID, r.Topic, pt.Target, pt.ParkedAt.Format(time.RFC3339), pt.Attempts, pt.Reason)
		}
	}
	tw.Flush()
	if len(rows) == f.limit {
		fmt.Fprintf(stdout, "(first %d rows; --limit for more)\n", f.limit)
	}
	return exitOK
}

func cmdOutboxRetry(fs *flag.FlagSet, f *outboxFlags, args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, outboxRetryHelp)); done {
		return code
	}
	var ids []int64
	if f.idList != "" {
		for _, s := range strings.Split(f.idList, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				fmt.Fprintf(stderr, "relayd outbox retry: --id: %q is not a row id\n", s)
				return exitUsage
			}
			ids = append(ids, id)
		}
	}
	if (len(ids) == 0) == !f.all {
		fmt.Fprintln(stderr, "relayd outbox retry: give --id N[,N...] or --all (one of them)")
		return exitUsage
	}
	targets, ok := parseTarget(fs.Name(), f.target, stderr)
	if !ok || !checkConnectTimeout(fs.Name(), f.connectTimeout, stderr) {
		return exitUsage
	}
	ss, code := connectSession(fs.Name(), stderr, env, 2, false, f.connectTimeout)
	if ss == nil {
		return code
	}
	defer ss.close()
	n, err := relay.RetryParked(ss.ctx, ss.pool, ss.cfg.table, targets, ids, f.all)
	if err != nil {
		ss.log.Error("outbox retry", "error", err.Error())
		return exitFailure
	}
	if f.asJSON {
		return printJSON(stdout, map[string]int64{"retried": n})
	}
	fmt.Fprintf(stdout, "%d parked delivery(ies) put back in line\n", n)
	return exitOK
}
