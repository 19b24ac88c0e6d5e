package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
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
Then what holds back VACUUM's horizon in the database the longest (while it
runs, the rows relayd deletes stay on disk) and relayd's tables' dead rows
and size.
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
	health, err := relay.ReadPostgres(ctx, pool, cfg.table)
	if err != nil {
		log.Error("read status", "error", err.Error())
		return exitFailure
	}
	if *asJSON {
		return printJSON(stdout, map[string]any{"table": cfg.table.String(), "targets": stats, "phase": ps.Phase, "relays": ps.Relays,
			"postgres": health})
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
	printPostgres(stdout, health)
	fmt.Fprintln(stdout)
	if phaseMissing {
		fmt.Fprintln(stdout, "phase  unknown: the outbox has no phase tables yet (relayd migrate adds them)")
		return exitOK
	}
	printPhase(stdout, ps)
	return exitOK
}

// printPostgres says who holds back VACUUM's horizon the longest, and what
// relayd's tables hold meanwhile.
func printPostgres(w io.Writer, h relay.PostgresHealth) {
	if x, ok := h.Oldest(); ok {
		who := x.Name
		if x.PID != 0 {
			who = fmt.Sprintf("%s, pid %d", x.Name, x.PID)
		}
		if x.State != "" {
			who += ", " + x.State
		}
		age := "for an unknown time (relayd's role needs pg_read_all_stats to see it)"
		switch {
		case x.AgeKnown:
			age = "for " + x.Age.Round(time.Second).String()
		case x.Kind == "standby" || x.Kind == "replication slot":
			age = "for a time Postgres does not give"
		}
		fmt.Fprintf(w, "horizon  held by a %s (%s) %s, %d transaction ids back\n", x.Kind, who, age, x.XIDs)
	} else {
		fmt.Fprintln(w, "horizon  held by nothing but relayd's own reads")
	}
	parts := make([]string, 0, len(h.Tables))
	for _, t := range h.Tables {
		parts = append(parts, fmt.Sprintf("%s %d dead, %d live, %s", t.Table, t.DeadTuples, t.LiveTuples, bytesText(t.Bytes)))
	}
	fmt.Fprintf(w, "tables   %s\n", strings.Join(parts, "; "))
}

// bytesText is n bytes in kB, MB or GB (powers of 1024), as Postgres's
// pg_size_pretty writes them.
func bytesText(n int64) string {
	const unit = 1024
	if n < 10*unit {
		return fmt.Sprintf("%d bytes", n)
	}
	v, suffix := float64(n)/unit, "kB"
	for _, s := range []string{"MB", "GB", "TB"} {
		if v < 10*unit {
			break
		}
		v, suffix = v/unit, s
	}
	return fmt.Sprintf("%.0f %s", v, suffix)
}
