package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// verifyCommand is relayd verify.
type verifyCommand struct {
	*cli
	since, until   string
	examples       int
	slack          time.Duration
	asJSON         bool
	connectTimeout time.Duration
}

func (c *verifyCommand) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.StringVar(&c.since, "since", "24h", "start of the window: RFC 3339 (2024-05-01T00:00:00Z) or a duration meaning that long ago (24h, 90m)")
	fs.StringVar(&c.until, "until", "", "end of the window, same forms (default: now)")
	fs.IntVar(&c.examples, "examples", verify.DefaultExamples, "ids listed per finding; 0: counts only")
	fs.DurationVar(&c.slack, "slack", verify.DefaultSlack, "how much wider than the window the stream is read, for clock differences between Postgres and NATS")
	fs.BoolVar(&c.asJSON, "json", false, "print the report as JSON")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *verifyCommand) Usage() string { return withFlagDefaults(c.flags(), verifyHelp) }

func (c *verifyCommand) Run(ctx context.Context, args []string) error {
	if err := parseFlags(c.flags(), args); err != nil {
		return err
	}
	now := time.Now()
	until := now
	if c.until != "" {
		t, err := parseWhen(c.until, now)
		if err != nil {
			return usagef("--until: %v", err)
		}
		until = t
	}
	since, err := parseWhen(c.since, now)
	switch {
	case err != nil:
		return usagef("--since: %v", err)
	case until.Before(since):
		return usagef("--until %s is before --since %s", until.Format(time.RFC3339), since.Format(time.RFC3339))
	case c.examples < 0:
		return usagef("--examples must be 0 or more")
	case c.slack <= 0:
		return usagef("--slack must be a positive duration, like 1m")
	}
	if err := checkConnectTimeout(c.connectTimeout); err != nil {
		return err
	}
	ss, err := openSession(ctx, c.cli, sessionOptions{Conns: readerConns, NATS: true, ConnectTimeout: c.connectTimeout})
	if err != nil {
		return err
	}
	defer ss.close()
	cfg := ss.cfg
	n := c.examples
	if n == 0 {
		n = -1 // verify.Config: negative means none
	}
	rep, err := verify.Run(ss.ctx, verify.Config{
		DB: ss.pool, Table: cfg.table, JS: ss.js, Stream: cfg.NATSStream, MoreStreams: routeStreams(cfg),
		Since: since, Until: until, Slack: c.slack, Examples: n, Logger: ss.log,
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			err = fmt.Errorf("%w (RELAY_NATS_STREAM, or a stream a route names)", err)
		}
		return logged("verify failed", err)
	}
	if c.asJSON {
		if err := printJSON(c.stdout, rep); err != nil {
			return err
		}
	} else {
		printVerify(c.stdout, rep)
	}
	if !rep.OK() {
		return errReported
	}
	return nil
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
