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

func cmdStatus(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	targetList := fs.String("targets", "", "amqp, nats or amqp,nats (default: those the outbox has rows for)")
	check := fs.Bool("check", false, "exit 1 when a target's lag or parked rows exceed --max-lag or --max-parked")
	var th statusCheck
	fs.DurationVar(&th.maxLag, "max-lag", time.Minute, "with --check, the most lag a target may have")
	fs.Int64Var(&th.maxParked, "max-parked", 0, "with --check, the most parked rows a target may have")
	asJSON := fs.Bool("json", false, "one JSON document, for scripts")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, statusHelp)); done {
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
	var stray string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "max-lag" || f.Name == "max-parked" {
			stray = f.Name
		}
	})
	switch {
	case stray != "" && !*check:
		fmt.Fprintf(stderr, "relayd status: --%s is a threshold of --check: give --check too (see relayd status --help)\n", stray)
		return exitUsage
	case th.maxLag < 0 || th.maxParked < 0:
		fmt.Fprintln(stderr, "relayd status: --max-lag and --max-parked must be 0 or more")
		return exitUsage
	case !checkConnectTimeout("status", *connectTimeout, stderr):
		return exitUsage
	}
	ss, code := connectSession("status", stderr, env, 2, false, *connectTimeout)
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
	var breaches []string
	if *check {
		breaches = th.breaches(stats)
	}
	if *asJSON {
		doc := map[string]any{"table": cfg.table.String(), "targets": stats, "phase": ps.Phase, "relays": ps.Relays, "postgres": health}
		if *check {
			doc["check"] = checkJSON{OK: len(breaches) == 0, MaxLagSeconds: th.maxLag.Seconds(), MaxParked: th.maxParked, Breaches: append([]string{}, breaches...)}
		}
		if code := printJSON(stdout, doc); code != exitOK {
			return code
		}
	} else {
		printStatus(stdout, cfg, stats, health, ps, phaseMissing)
	}
	for _, b := range breaches {
		fmt.Fprintf(stderr, "relayd status: %s\n", b)
	}
	if len(breaches) > 0 {
		return exitFailure
	}
	return exitOK
}

// checkJSON is --check's verdict in --json.
type checkJSON struct {
	OK            bool     `json:"ok"`
	MaxLagSeconds float64  `json:"max_lag_seconds"`
	MaxParked     int64    `json:"max_parked"`
	Breaches      []string `json:"breaches"`
}

// printStatus writes status's report as text.
func printStatus(w io.Writer, cfg *config, stats []relay.TargetStats, health relay.PostgresHealth, ps phaseState, phaseMissing bool) {
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
	if phaseMissing {
		fmt.Fprintln(w, "phase  unknown: the outbox has no phase tables yet (relayd migrate adds them)")
		return
	}
	printPhase(w, ps)
}

// printPostgres says who holds back VACUUM's horizon the longest, and what
// relayd's tables hold meanwhile.
func printPostgres(w io.Writer, h relay.PostgresHealth) {
	if x, ok := h.Oldest(); ok {
		fmt.Fprintf(w, "horizon  %s\n", holderText(x))
	} else {
		fmt.Fprintln(w, "horizon  held by nothing but relayd's own reads")
	}
	fmt.Fprintf(w, "tables   %s\n", tablesText(h))
}

// holderText says who holds the horizon and how long: "held by a snapshot
// (pg_dump, pid 42, active) for 2h0m0s, 1200 transaction ids back".
func holderText(x relay.HorizonHolder) string {
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
func holderTextAged(x relay.HorizonHolder, age string) string {
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
func tablesText(h relay.PostgresHealth) string {
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
