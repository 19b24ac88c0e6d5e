package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/relay"
)

const statusHelp = `Usage: relayd status [--targets amqp,nats] [--json] [--connect-timeout D]

Prints, for each target the outbox has rows for (delivered, tried or parked
for it; every target when nothing has been relayed yet), how far the relay
is behind: rows pending, the lag (age of the oldest pending row by the
database clock), the oldest pending row, rows waiting for a retry, parked
rows, keys held by a parked row (their later rows wait) and the last error.
Then the migration phase the relays share (relayd phase) and the running
relays, each with the phase it runs and whether RELAY_TARGETS pins it.
The shell's RELAY_TARGETS is not read: it need not be the relays'.
Needs only RELAY_DATABASE_URL (and RELAY_OUTBOX_TABLE). Exit status 0 when
the figures were read, whatever they say; 1 when Postgres could not be read.

  --targets T           report these targets (amqp, nats or amqp,nats)
  --json                one JSON document, for scripts
` + connectTimeoutHelp

func cmdStatus(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	targetList := fs.String("targets", "", "amqp, nats or amqp,nats (default: those the outbox has rows for)")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args, stdout, stderr, statusHelp); done {
		return code
	}
	var targets []relay.Target
	if *targetList != "" {
		t, err := relay.ParseTargets(*targetList)
		if err != nil {
			fmt.Fprintf(stderr, "relayd status: --targets: %v\n", err)
			return exitUsage
		}
		targets = t
	}
	if !checkConnectTimeout("status", *connectTimeout, stderr) {
		return exitUsage
	}
	ss, code := openSession(stderr, env, 2, false, *connectTimeout)
	if ss == nil {
		return code
	}
	defer ss.close()
	cfg, log, ctx, pool := ss.cfg, ss.log, ss.ctx, ss.pool
	if targets == nil {
		var err error
		if targets, err = relay.ActiveTargets(ctx, pool, cfg.table); err != nil {
			log.Error("read status", "error", err.Error())
			return exitFailure
		}
	}
	stats, err := relay.ReadStats(ctx, pool, cfg.table, targets)
	if err != nil {
		log.Error("read status", "error", err.Error())
		return exitFailure
	}
	// An outbox not migrated to the phase tables still gets its figures.
	ps, err := readPhaseState(ctx, pool, cfg.table, false)
	if err != nil && !notMigrated(err) {
		log.Error("read status", "error", err.Error())
		return exitFailure
	}
	phaseMissing := err != nil
	if *asJSON {
		return printJSON(stdout, map[string]any{"table": cfg.table.String(), "targets": stats, "phase": ps.Phase, "relays": ps.Relays})
	}
	fmt.Fprintf(stdout, "outbox %s\n\n", cfg.table)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tPENDING\tLAG\tOLDEST PENDING (ID, TOPIC, AGE)\tRETRYING\tPARKED\tHELD KEYS\tLAST ERROR")
	for _, s := range stats {
		pending := fmt.Sprint(s.Pending)
		if !s.PendingExact {
			pending = "~" + pending
		}
		oldest := "-"
		if s.Pending > 0 {
			oldest = fmt.Sprintf("%d, %s, %s", s.OldestID, s.OldestTopic, s.Lag.Round(time.Millisecond))
		}
		lastErr := s.LastError
		if lastErr == "" {
			lastErr = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", s.Target, pending, s.Lag.Round(time.Millisecond), oldest, s.Retrying, s.Parked, s.HeldKeys, lastErr)
	}
	tw.Flush()
	fmt.Fprintln(stdout)
	if phaseMissing {
		fmt.Fprintln(stdout, "phase  unknown: the outbox has no phase tables yet (relayd migrate adds them)")
		return exitOK
	}
	printPhase(stdout, ps)
	return exitOK
}
