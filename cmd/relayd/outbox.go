package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/relay"
)

const outboxHelp = `Usage:
  relayd outbox parked [--target amqp|nats] [--limit N] [--json]
  relayd outbox retry (--id N[,N...] | --all) [--target amqp|nats]

parked lists rows that will not be retried without an operator, with the
reason per target. retry puts them back in line (attempts start again from 0)
once the cause is fixed. Both are safe while relays run. Without --target,
the targets in RELAY_TARGETS. Needs RELAY_DATABASE_URL and RELAY_OUTBOX_TABLE.
`

func cmdOutbox(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	if len(args) == 0 || (args[0] != "parked" && args[0] != "retry") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprint(stdout, outboxHelp)
			return exitOK
		}
		fmt.Fprint(stderr, outboxHelp)
		return exitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("outbox "+sub, flag.ContinueOnError)
	target := fs.String("target", "", "amqp or nats (default: the targets in RELAY_TARGETS)")
	asJSON := fs.Bool("json", false, "print JSON")
	limit := fs.Int("limit", 1000, "list at most N rows")
	idList := fs.String("id", "", "row ids to retry, comma-separated")
	all := fs.Bool("all", false, "retry every parked row")
	if code, done := parseFlags(fs, args[1:], stdout, stderr, outboxHelp); done {
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
	if sub == "retry" && (len(ids) == 0) == !*all {
		fmt.Fprintln(stderr, "relayd outbox retry: give --id N[,N...] or --all (one of them)")
		return exitUsage
	}
	if *limit < 1 {
		fmt.Fprintln(stderr, "relayd outbox parked: --limit must be positive")
		return exitUsage
	}
	ss, code := openSession(stderr, env, 2, false)
	if ss == nil {
		return code
	}
	defer ss.close()
	cfg, log, ctx, pool := ss.cfg, ss.log, ss.ctx, ss.pool
	targets := cfg.targets
	if *target != "" {
		t, err := relay.ParseTargets(*target)
		if err != nil || len(t) != 1 {
			fmt.Fprintf(stderr, "relayd outbox %s: --target: want amqp or nats\n", sub)
			return exitUsage
		}
		targets = t
	}
	if sub == "retry" {
		n, err := relay.RetryParked(ctx, pool, cfg.table, targets, ids, *all)
		if err != nil {
			log.Error("outbox retry", "error", err.Error())
			return exitFailure
		}
		fmt.Fprintf(stdout, "%d parked delivery(ies) put back in line\n", n)
		return exitOK
	}
	rows, err := relay.ListParked(ctx, pool, cfg.table, targets, *limit)
	if err != nil {
		log.Error("outbox parked", "error", err.Error())
		return exitFailure
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if rows == nil {
			rows = []relay.ParkedRow{}
		}
		enc.Encode(rows) //nolint:errcheck // stdout
		return exitOK
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
