package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/relay"
)

const statusHelp = `Usage: relayd status [--json]

Prints, for each target in RELAY_TARGETS, how far the relay is behind: rows
pending, the lag (age of the oldest pending row by the database clock), the
oldest pending row, rows waiting for a retry, parked rows, keys held by a
parked row (their later rows wait) and the last error.
Needs only RELAY_DATABASE_URL (and RELAY_OUTBOX_TABLE). Exit status 0 when
the figures were read, whatever they say.

  --json   one JSON document, for scripts
`

func cmdStatus(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	if code, done := parseFlags(fs, args, stdout, stderr, statusHelp); done {
		return code
	}
	ss, code := openSession(stderr, env, 2, false)
	if ss == nil {
		return code
	}
	defer ss.close()
	cfg, log, ctx, pool := ss.cfg, ss.log, ss.ctx, ss.pool
	stats, err := relay.ReadStats(ctx, pool, cfg.table, cfg.targets)
	if err != nil {
		log.Error("read status", "error", err.Error())
		return exitFailure
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"table": cfg.table.String(), "targets": stats}); err != nil {
			return exitFailure
		}
		return exitOK
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
	return exitOK
}
