package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayd/relayd/internal/pghealth"
	"github.com/relayd/relayd/relay"
)

const statusHelp = `Usage: relayd status [--targets amqp,nats] [--check [--max-lag D] [--max-parked N]] [--json] [--connect-timeout D]

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
Needs only RELAY_DATABASE_URL (and RELAY_OUTBOX_TABLE).

Exit status: 0 when the figures were read, whatever they say; with --check,
1 when a target's lag exceeds --max-lag or its parked rows --max-parked
(each named on stderr), for a cron job or a probe. 1 when Postgres could not
be read, 2 bad usage.

Flags:
`

// statusCheck is --check's thresholds.
type statusCheck struct {
	maxLag    time.Duration
	maxParked int64
}

// breaches are the targets' figures past the thresholds, one line each.
func (c statusCheck) breaches(stats []relay.TargetStats) []string {
	var out []string
	for _, s := range stats {
		if s.Lag > c.maxLag {
			out = append(out, fmt.Sprintf("%s: lag %s, over --max-lag %s", s.Target, s.Lag.Round(time.Millisecond), c.maxLag))
		}
		if s.Parked > c.maxParked {
			out = append(out, fmt.Sprintf("%s: %d parked, over --max-parked %d", s.Target, s.Parked, c.maxParked))
		}
	}
	return out
}

// statusCommand is relayd status: how far behind each target is.
type statusCommand struct {
	*cli
	targets        string
	check          bool
	th             statusCheck
	asJSON         bool
	connectTimeout time.Duration
}

func (c *statusCommand) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.StringVar(&c.targets, "targets", "", "amqp, nats or amqp,nats (default: those the outbox has rows for)")
	fs.BoolVar(&c.check, "check", false, "exit 1 when a target's lag or parked rows exceed --max-lag or --max-parked")
	fs.DurationVar(&c.th.maxLag, "max-lag", time.Minute, "with --check, the most lag a target may have")
	fs.Int64Var(&c.th.maxParked, "max-parked", 0, "with --check, the most parked rows a target may have")
	fs.BoolVar(&c.asJSON, "json", false, "one JSON document, for scripts")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *statusCommand) Usage() string { return withFlagDefaults(c.flags(), statusHelp) }

func (c *statusCommand) Run(ctx context.Context, args []string) error {
	fs := c.flags()
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var targets []relay.Target
	if c.targets != "" {
		t, err := relay.ParseTargets(c.targets)
		if err != nil {
			return usagef("--targets: %v", err)
		}
		targets = t
	}
	var stray string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "max-lag" || f.Name == "max-parked" {
			stray = f.Name
		}
	})
	th := c.th
	switch {
	case stray != "" && !c.check:
		return usagef("--%s is a threshold of --check: give --check too (see relayd status --help)", stray)
	case th.maxLag < 0 || th.maxParked < 0:
		return usagef("--max-lag and --max-parked must be 0 or more")
	}
	if err := checkConnectTimeout(c.connectTimeout); err != nil {
		return err
	}
	ss, err := openSession(ctx, c.cli, sessionOptions{Conns: readerConns, ConnectTimeout: c.connectTimeout})
	if err != nil {
		return err
	}
	defer ss.close()
	cfg, ctx, pool := ss.cfg, ss.ctx, ss.pool
	if targets == nil {
		if targets, err = relay.ActiveTargets(ctx, pool, cfg.table); err != nil {
			return logged("read status", err)
		}
	}
	stats, err := relay.ReadStats(ctx, pool, cfg.table, targets)
	if err != nil {
		return logged("read status", err)
	}
	ps, err := readPhaseState(ctx, pool, cfg.table, false)
	if err != nil {
		return logged("read status", err)
	}
	health, err := pghealth.Read(ctx, pool, cfg.table)
	if err != nil {
		return logged("read status", err)
	}
	var breaches []string
	if c.check {
		breaches = th.breaches(stats)
	}
	if c.asJSON {
		doc := map[string]any{"table": cfg.table.String(), "targets": stats, "phase": ps.Phase, "relays": ps.Relays, "postgres": health}
		if c.check {
			doc["check"] = checkJSON{OK: len(breaches) == 0, MaxLagSeconds: th.maxLag.Seconds(), MaxParked: th.maxParked, Breaches: append([]string{}, breaches...)}
		}
		if err := printJSON(c.stdout, doc); err != nil {
			return err
		}
	} else {
		printStatus(c.stdout, cfg, stats, health, ps)
	}
	var failed []error // a line each
	for _, b := range breaches {
		failed = append(failed, errors.New(b))
	}
	return errors.Join(failed...)
}

// checkJSON is --check's verdict in --json.
type checkJSON struct {
	OK            bool     `json:"ok"`
	MaxLagSeconds float64  `json:"max_lag_seconds"`
	MaxParked     int64    `json:"max_parked"`
	Breaches      []string `json:"breaches"`
}

// printStatus writes status's report as text.
func printStatus(w io.Writer, cfg *config, stats []relay.TargetStats, health pghealth.Health, ps phaseState) {
	fmt.Fprintf(w, "outbox %s\n\n", cfg.table)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
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
	fmt.Fprintln(w)
	printPostgres(w, health)
	fmt.Fprintln(w)
	printPhase(w, ps)
}

// printPostgres says who holds back VACUUM's horizon the longest, and what
// relayd's tables hold meanwhile.
func printPostgres(w io.Writer, h pghealth.Health) {
	if x, ok := h.Oldest(); ok {
		fmt.Fprintf(w, "horizon  %s\n", holderText(x))
	} else {
		fmt.Fprintln(w, "horizon  held by nothing but relayd's own reads")
	}
	fmt.Fprintf(w, "tables   %s\n", tablesText(h))
}

// holderText says who holds the horizon and how long: "held by a snapshot
// (pg_dump, pid 42, active) for 2h0m0s, 1200 transaction ids back".
func holderText(x pghealth.Holder) string {
	age := "for an unknown time (relayd's role needs pg_read_all_stats to see it)"
	switch {
	case x.AgeKnown:
		age = "for " + x.Age.Round(time.Second).String()
	case x.Kind == "standby" || x.Kind == "replication slot":
		age = "for a time Postgres does not give"
	}
	return holderTextAged(x, age)
}

// holderTextAged is holderText with age saying how long it has held.
func holderTextAged(x pghealth.Holder, age string) string {
	who := x.Name
	if x.PID != 0 {
		who = fmt.Sprintf("%s, pid %d", x.Name, x.PID)
	}
	if x.State != "" {
		who += ", " + x.State
	}
	return fmt.Sprintf("held by a %s (%s) %s, %d transaction ids back", x.Kind, who, age, x.XIDs)
}

// tablesText is relayd's tables' dead and live rows and size, on one line.
func tablesText(h pghealth.Health) string {
	parts := make([]string, 0, len(h.Tables))
	for _, t := range h.Tables {
		parts = append(parts, fmt.Sprintf("%s %d dead, %d live, %s", t.Table, t.DeadTuples, t.LiveTuples, bytesText(t.Bytes)))
	}
	return strings.Join(parts, "; ")
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
