package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/verify"
)

const verifyHelp = `Usage: relayd verify [--since T] [--until T] [--examples N] [--slack D] [--json] [--connect-timeout D]

Reconciles the outbox's record with the JetStream stream, for a window of
time (default: the last 24 hours):

  - every message id recorded as delivered to JetStream (nats_delivered_at
    in the window, in the outbox's _owed or _delivered table) must be in the
    stream exactly once;
  - so must every id ` + "`relayd backfill`" + ` moved in the window;
  - no Nats-Msg-Id may be stored twice anywhere in the scanned part of the
    stream, whoever published it.

Messages without a Nats-Msg-Id are counted, not checked. The stream is read
headers only, by the stream's clock from since - slack - its duplicate window
(a retried publish is recorded up to that late) to until + slack, or to its
last sequence at the start; the ids go to a temporary table in Postgres, so
memory does not grow with the window. Nothing is written to the outbox.

Uses RELAY_DATABASE_URL, RELAY_OUTBOX_TABLE, RELAY_NATS_URL, RELAY_NATS_CREDS
and RELAY_NATS_STREAM.

Exit status: 0 nothing missing or duplicated, 1 something is (or the check
failed, or Postgres or NATS did not answer within --connect-timeout), 2 bad
usage.

Flags:
`

func cmdVerify(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	sinceFlag := fs.String("since", "24h", "start of the window: RFC 3339 (2024-05-01T00:00:00Z) or a duration meaning that long ago (24h, 90m)")
	untilFlag := fs.String("until", "", "end of the window, same forms (default: now)")
	examples := fs.Int("examples", verify.DefaultExamples, "ids listed per finding; 0: counts only")
	slack := fs.Duration("slack", verify.DefaultSlack, "how much wider than the window the stream is read, for clock differences between Postgres and NATS")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, verifyHelp)); done {
		return code
	}
	now := time.Now()
	until := now
	if *untilFlag != "" {
		t, err := parseWhen(*untilFlag, now)
		if err != nil {
			fmt.Fprintf(stderr, "relayd verify: --until: %v\n", err)
			return exitUsage
		}
		until = t
	}
	since, err := parseWhen(*sinceFlag, now)
	if err != nil {
		fmt.Fprintf(stderr, "relayd verify: --since: %v\n", err)
		return exitUsage
	}
	if until.Before(since) {
		fmt.Fprintf(stderr, "relayd verify: --until %s is before --since %s\n", until.Format(time.RFC3339), since.Format(time.RFC3339))
		return exitUsage
	}
	if *examples < 0 {
		fmt.Fprintln(stderr, "relayd verify: --examples must be 0 or more")
		return exitUsage
	}
	if *slack <= 0 {
		fmt.Fprintln(stderr, "relayd verify: --slack must be a positive duration, like 1m")
		return exitUsage
	}
	if !checkConnectTimeout("verify", *connectTimeout, stderr) {
		return exitUsage
	}
	ss, code := connectSession("verify", stderr, env, 2, true, *connectTimeout)
	if ss == nil {
		return code
	}
	defer ss.close()
	cfg, log, ctx, pool, js := ss.cfg, ss.log, ss.ctx, ss.pool, ss.js
	n := *examples
	if n == 0 {
		n = -1 // verify.Config: negative means none
	}
	rep, err := verify.Run(ctx, verify.Config{
		DB: pool, Table: cfg.table, JS: js, Stream: cfg.NATSStream, MoreStreams: routeStreams(cfg),
		Since: since, Until: until, Slack: *slack, Examples: n, Logger: log,
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			err = fmt.Errorf("%w (RELAY_NATS_STREAM, or a stream a route names)", err)
		}
		log.Error("verify failed", "error", err.Error())
		return exitFailure
	}
	if *asJSON {
		if code := printJSON(stdout, rep); code != exitOK {
			return code
		}
	} else {
		printVerify(stdout, rep)
	}
	if !rep.OK() {
		return exitFailure
	}
	return exitOK
}

// parseWhen reads RFC 3339 or a duration meaning "that long before now".
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want RFC 3339 (2024-05-01T00:00:00Z) or a duration ago (24h)", s)
	}
	if d < 0 {
		return time.Time{}, fmt.Errorf("%q: a duration means that long ago; it cannot be negative", s)
	}
	return now.Add(-d), nil
}

func printVerify(w io.Writer, r verify.Report) {
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	fmt.Fprintf(w, "verify outbox %s against stream %s\n", r.Table, r.Stream)
	fmt.Fprintf(w, "window   %s .. %s (stream read from %s to %s at most)\n", ts(r.Since), ts(r.Until), ts(r.Scan.From), ts(r.Scan.To))
	scanned := func(name string, s verify.Scan) {
		if s.Messages == 0 {
			fmt.Fprintf(w, "stream   %sno messages in range (last sequence %d)\n", name, s.LastSeqAtStart)
		} else {
			fmt.Fprintf(w, "stream   %s%d messages read (seq %d..%d), %d without Nats-Msg-Id\n", name, s.Messages, s.FirstSeq, s.LastSeq, s.WithoutMsgID)
		}
	}
	if len(r.MoreScans) == 0 {
		scanned("", r.Scan)
	} else {
		scanned(r.Stream+": ", r.Scan)
		for _, m := range r.MoreScans {
			scanned(m.Stream+": ", m.Scan)
		}
	}
	check := func(name, what, verb string, c verify.Check) {
		if c.Skipped != "" {
			fmt.Fprintf(w, "%-8s not checked: %s\n", name, c.Skipped)
			return
		}
		fmt.Fprintf(w, "%-8s %d %s ids checked: %d missing, %d duplicated\n", name, c.Checked, what, c.Missing, c.Duplicated)
		for _, m := range c.MissingExamples {
			fmt.Fprintf(w, "  missing     %s (%s %s)\n", m.ID, verb, ts(m.At))
		}
		printDups(w, c.DuplicatedExamples)
	}
	check("outbox", "delivered", "delivered", r.Outbox)
	check("backfill", "moved", "moved", r.Backfill)
	d := r.StreamDuplicates
	fmt.Fprintf(w, "stream   %d ids stored more than once (%d extra copies)\n", d.IDs, d.Extra)
	printDups(w, d.Examples)
	if r.OK() {
		fmt.Fprintln(w, "OK: nothing missing or duplicated")
		return
	}
	fmt.Fprintf(w, "FAILED: %d missing, %d duplicated ids\n",
		r.Outbox.Missing+r.Backfill.Missing, r.StreamDuplicates.IDs)
}

func printDups(w io.Writer, ds []verify.Duplicate) {
	for _, d := range ds {
		seqs := make([]string, len(d.Seqs))
		for i, s := range d.Seqs {
			seqs[i] = fmt.Sprint(s)
		}
		more := ""
		if int64(len(d.Seqs)) < d.Copies {
			more = fmt.Sprintf(", … (%d copies)", d.Copies)
		}
		fmt.Fprintf(w, "  duplicated  %s at seq %s%s\n", d.ID, strings.Join(seqs, ", "), more)
	}
}
