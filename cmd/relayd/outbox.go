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
RELAY_DATABASE_URL and RELAY_OUTBOX_TABLE. relayd outbox parked --help and
relayd outbox retry --help list each one's flags.
`

const outboxParkedHelp = `Usage: relayd outbox parked [--target amqp|nats] [--limit N] [--json] [--connect-timeout D]

Lists rows that will not be retried without an operator, with the reason per
target, oldest first. Safe while relays run.

  --target T            amqp or nats (default: every target)
  --limit N             list at most N rows (default 1000)
  --json                print JSON
` + connectTimeoutHelp

const outboxRetryHelp = `Usage: relayd outbox retry (--id N[,N...] | --all) [--target amqp|nats] [--json] [--connect-timeout D]

Puts parked rows back in line, their attempts started again from 0, once the
cause is fixed. Safe while relays run.

  --id N[,N...]         the rows to retry, by id
  --all                 every parked row
  --target T            amqp or nats (default: every target)
  --json                print {"retried": N}
` + connectTimeoutHelp

func cmdOutbox(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	switch {
	case len(args) > 0 && args[0] == "parked":
		return cmdOutboxParked(args[1:], stdout, stderr, env)
	case len(args) > 0 && args[0] == "retry":
		return cmdOutboxRetry(args[1:], stdout, stderr, env)
	case len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		fmt.Fprint(stdout, outboxHelp)
		return exitOK
	}
	fmt.Fprint(stderr, outboxHelp)
	return exitUsage
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

func cmdOutboxParked(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("outbox parked", flag.ContinueOnError)
	target := fs.String("target", "", "amqp or nats (default: every target)")
	asJSON := fs.Bool("json", false, "print JSON")
	limit := fs.Int("limit", 1000, "list at most N rows")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args, stdout, stderr, outboxParkedHelp); done {
		return code
	}
	if *limit < 1 {
		fmt.Fprintln(stderr, "relayd outbox parked: --limit must be positive")
		return exitUsage
	}
	targets, ok := parseTarget(fs.Name(), *target, stderr)
	if !ok || !checkConnectTimeout(fs.Name(), *connectTimeout, stderr) {
		return exitUsage
	}
	ss, code := openSession(stderr, env, 2, false, *connectTimeout)
	if ss == nil {
		return code
	}
	defer ss.close()
	rows, err := relay.ListParked(ss.ctx, ss.pool, ss.cfg.table, targets, *limit)
	if err != nil {
		ss.log.Error("outbox parked", "error", err.Error())
		return exitFailure
	}
	if *asJSON {
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
	if len(rows) == *limit {
		fmt.Fprintf(stdout, "(first %d rows; --limit for more)\n", *limit)
	}
	return exitOK
}

func cmdOutboxRetry(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("outbox retry", flag.ContinueOnError)
	target := fs.String("target", "", "amqp or nats (default: every target)")
	idList := fs.String("id", "", "row ids to retry, comma-separated")
	all := fs.Bool("all", false, "retry every parked row")
	asJSON := fs.Bool("json", false, "print JSON")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args, stdout, stderr, outboxRetryHelp); done {
		return code
	}
	var ids []int64
	if *idList != "" {
		for _, s := range strings.Split(*idList, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				fmt.Fprintf(stderr, "relayd outbox retry: --id: %q is not a row id\n", s)
				return exitUsage
			}
			ids = append(ids, id)
		}
	}
	if (len(ids) == 0) == !*all {
		fmt.Fprintln(stderr, "relayd outbox retry: give --id N[,N...] or --all (one of them)")
		return exitUsage
	}
	targets, ok := parseTarget(fs.Name(), *target, stderr)
	if !ok || !checkConnectTimeout(fs.Name(), *connectTimeout, stderr) {
		return exitUsage
	}
	ss, code := openSession(stderr, env, 2, false, *connectTimeout)
	if ss == nil {
		return code
	}
	defer ss.close()
	n, err := relay.RetryParked(ss.ctx, ss.pool, ss.cfg.table, targets, ids, *all)
	if err != nil {
		ss.log.Error("outbox retry", "error", err.Error())
		return exitFailure
	}
	if *asJSON {
		return printJSON(stdout, map[string]int64{"retried": n})
	}
	fmt.Fprintf(stdout, "%d parked delivery(ies) put back in line\n", n)
	return exitOK
}
