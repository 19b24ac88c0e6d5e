package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sethvargo/go-envconfig"
	"golang.org/x/term"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/cutover"
)

const cutoverHelp = `Usage: relayd cutover check --dual-read|--rolling-upgrade GROUP ... [flags]

Says whether consumer groups may read JetStream only. A group is a durable
JetStream consumer and the legacy queue it replaces, given as
[STREAM/]DURABLE[:QUEUE] with the path it moves on:

  --dual-read GROUP        reads both brokers through an inbox: checked under
                           live traffic; its queue may keep its consumers
  --rolling-upgrade GROUP  one side at a time: its queue empty and unconsumed,
                           its subjects quiet for the quiet interval
  --consumer DURABLE [--queue Q]  one rolling-upgrade group

--dual-read and --rolling-upgrade repeat, one group each; a group that
has moved is named without its queue. Check one group before it drops its
legacy side; check them all before relayd phase set nats, which runs the
same check. Prints PASS or FAIL per condition, for the outbox and per group:

  outbox             nothing parked for nats, no row finished without
                     JetStream lately, the relays less than 30s behind
  relayd phases      every running relay in dual or nats, and in the
                     table's phase once one is set (relayd phase)
  relayd versions    with --instances: every relayd answers the same
                     /version
  consumers named    with --all-consumers (phase set nats: always): every
                     durable consumer of the groups' streams is a group,
                     or --exclude'd
  legacy queue       dual read: seen with 0 ready within its consumer's
                     AckWait; rolling upgrade: 0 ready and 0 consumers
  jetstream consumer durable and acking; dual read: acks, within its
                     AckWait, all the stream held when the check began;
                     rolling upgrade: 0 pending and 0 ack pending
  quiescence         rolling upgrade: the above hold and the consumer gets
                     no message for the quiet interval (its AckWait, or
                     its last BackOff step if longer), and nothing is owed
                     to JetStream from before it

Exit status: 0 all pass, 1 any fails (or a service could not be reached
within --connect-timeout), 2 usage. Uses RELAY_DATABASE_URL,
RELAY_OUTBOX_TABLE, RELAY_NATS_URL, RELAY_NATS_STREAM (the stream of groups
that name none, unless --stream) and RELAY_AMQP_URL.

Flags:
`

// cutoverArgs are cutover check's flags.
type cutoverArgs struct {
	groups                     groupsFlag
	exclude                    namesFlag
	allConsumers               bool // phase set nats: always
	consumer, queue, instances string
	stream                     string // "": RELAY_NATS_STREAM
	quiet, timeout, connect    time.Duration
	conservative, wait, asJSON bool
}

func cmdCutover(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	a, code, done := parseCutoverArgs(args, stdout, stderr, env)
	if done {
		return code
	}
	ss, code := connectSession("cutover check", stderr, env, 2, true, a.connect)
	if ss == nil {
		return code
	}
	defer ss.close()
	ccfg, tty, err := cutoverConfig(ss, a, stderr)
	if err != nil {
		ss.log.Error("cutover check", "error", err.Error())
		return exitFailure
	}
	return checkCutover(ss, ccfg, a, tty, stdout, stderr)
}

// parseCutoverArgs reads and checks the flags; done says to exit with code.
func parseCutoverArgs(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) (a cutoverArgs, code int, done bool) {
	fs := flag.NewFlagSet("cutover check", flag.ContinueOnError)
	connect := addCutoverFlags(fs, &a)
	fs.BoolVar(&a.asJSON, "json", false, "print the verdict as JSON")
	fs.BoolVar(&a.allConsumers, "all-consumers", false, "every durable consumer of the groups' streams must be a group or --exclude'd (as phase set nats requires)")
	help := withFlagDefaults(fs, cutoverHelp)
	action, args := takeAction(args, fs)
	if action != "check" {
		if action == "" {
			// The help, or a usage error for a flag.
			if code, done := parseFlags(fs, args, stdout, stderr, help); done {
				return a, code, true
			}
		}
		fmt.Fprintln(stderr, "relayd cutover: want `relayd cutover check --dual-read DURABLE` (see relayd cutover check --help)")
		return a, exitUsage, true
	}
	if code, done := parseFlags(fs, args, stdout, stderr, help); done {
		return a, code, true
	}
	a.connect = *connect
	if !validCutoverArgs(fs, &a, env, stderr) {
		return a, exitUsage, true
	}
	if len(a.exclude) > 0 && !a.allConsumers {
		fmt.Fprintln(stderr, "relayd cutover check: --exclude goes with --all-consumers (see relayd cutover check --help)")
		return a, exitUsage, true
	}
	if len(a.groups) == 0 {
		fmt.Fprintln(stderr, "relayd cutover check: name a group: --dual-read, --rolling-upgrade or --consumer (see relayd cutover check --help)")
		return a, exitUsage, true
	}
	return a, exitOK, false
}

// addCutoverFlags adds the check's flags to fs, into a: cutover check's,
// which phase set nats takes too. It returns --connect-timeout.
func addCutoverFlags(fs *flag.FlagSet, a *cutoverArgs) *time.Duration {
	fs.Var(groupPath{&a.groups, cutover.DualRead}, "dual-read", "a group that reads both brokers through an inbox: [STREAM/]DURABLE[:QUEUE] (repeats)")
	fs.Var(groupPath{&a.groups, cutover.RollingUpgrade}, "rolling-upgrade", "a group that moves one side at a time: [STREAM/]DURABLE[:QUEUE] (repeats)")
	fs.StringVar(&a.consumer, "consumer", "", "one rolling-upgrade group's durable consumer (as --rolling-upgrade DURABLE)")
	fs.StringVar(&a.queue, "queue", "", "with --consumer, the legacy queue it replaces")
	fs.Var(&a.exclude, "exclude", "with every consumer required, a durable consumer that is no group's (repeats)")
	fs.StringVar(&a.stream, "stream", "", "the stream of the groups that name none (default RELAY_NATS_STREAM)")
	fs.DurationVar(&a.quiet, "quiet-period", 0, "a rolling-upgrade group's quiet interval (default: its consumer's AckWait or last BackOff step)")
	fs.BoolVar(&a.conservative, "conservative", false, "quiet interval AckWait x (MaxAckPending + 1)")
	fs.StringVar(&a.instances, "instances", "", "relayd metrics addresses host:port,... that must report one version")
	fs.BoolVar(&a.wait, "wait", false, "check again every 2s until every condition passes or --timeout")
	fs.DurationVar(&a.timeout, "timeout", 30*time.Minute, "with --wait, give up after this long")
	return connectTimeoutFlag(fs)
}

// validCutoverArgs checks the flags addCutoverFlags read and folds
// --consumer/--queue into the groups; false: it has printed why (exit 2).
func validCutoverArgs(fs *flag.FlagSet, a *cutoverArgs, env envconfig.Lookuper, stderr io.Writer) bool {
	name := fs.Name()
	if a.stream != "" && !validNATSName(a.stream) {
		fmt.Fprintf(stderr, "relayd %s: --stream %q is not a valid stream name\n", name, a.stream)
		return false
	}
	switch {
	case a.queue != "" && a.consumer == "":
		fmt.Fprintf(stderr, "relayd %s: --queue goes with --consumer; for several groups, --dual-read or --rolling-upgrade DURABLE:QUEUE\n", name)
		return false
	case a.consumer != "":
		spec := a.consumer
		if a.queue != "" {
			spec += ":" + a.queue
		}
		if err := (groupPath{&a.groups, cutover.RollingUpgrade}).Set(spec); err != nil {
			fmt.Fprintf(stderr, "relayd %s: --consumer: %v\n", name, err)
			return false
		}
	}
	if err := a.groups.unique(); err != nil {
		fmt.Fprintf(stderr, "relayd %s: %v\n", name, err)
		return false
	}
	if a.quiet < 0 || a.timeout <= 0 {
		fmt.Fprintf(stderr, "relayd %s: --quiet-period and --timeout must be positive\n", name)
		return false
	}
	if !checkConnectTimeout(name, a.connect, stderr) {
		return false
	}
	return !a.groups.withQueue() || amqpURLOK(env, stderr)
}

// cutoverConfig is cutover.Config for the session and flags; on a
// terminal (tty) it shows the quiet interval's progress on stderr.
func cutoverConfig(ss *session, a cutoverArgs, stderr io.Writer) (ccfg cutover.Config, tty bool, err error) {
	tlsCfg, err := ss.cfg.amqpTLS()
	if err != nil {
		return cutover.Config{}, false, err
	}
	var addrs []string
	if a.instances != "" {
		addrs = strings.Split(a.instances, ",")
	}
	groups, err := a.groups.resolve(cmp.Or(a.stream, ss.cfg.NATSStream))
	if err != nil {
		return cutover.Config{}, false, err
	}
	ccfg = cutover.Config{
		DB: ss.pool, Table: ss.cfg.table, JS: ss.js, Groups: groups,
		AMQPURL: ss.cfg.AMQPURL, AMQPTLS: tlsCfg, QuietPeriod: a.quiet, Conservative: a.conservative, Instances: addrs,
		AllConsumers: a.allConsumers, Exclude: a.exclude,
	}
	if f, ok := stderr.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	if tty {
		ccfg.OnSample = func(elapsed, total time.Duration) {
			fmt.Fprintf(stderr, "\rwatching for %s of at most %s ", elapsed.Round(time.Second), total)
		}
	}
	return ccfg, tty, nil
}

// checkCutover checks once, or with --wait until every condition passes or
// --timeout, and prints the verdict; it returns the exit code.
func checkCutover(ss *session, ccfg cutover.Config, a cutoverArgs, tty bool, stdout, stderr io.Writer) int {
	res, ok := awaitCutover(ss, ccfg, a, tty, stderr)
	if !ok {
		return exitFailure
	}
	printVerdict(stdout, res, a.asJSON)
	if res.OK {
		return exitOK
	}
	return exitFailure
}

// awaitCutover checks once, or with --wait until every condition passes or
// --timeout; ok is false when the check could not be made (logged).
func awaitCutover(ss *session, ccfg cutover.Config, a cutoverArgs, tty bool, stderr io.Writer) (res cutover.Result, ok bool) {
	deadline := time.Now().Add(a.timeout)
	for attempt := 1; ; attempt++ {
		res, err := cutover.Check(ss.ctx, ccfg)
		if tty && ccfg.OnSample != nil {
			fmt.Fprint(stderr, "\r\033[K")
		}
		var cfgErr *cutover.ConfigError
		switch {
		case errors.Is(err, context.Canceled):
			return res, false
		case err != nil && (!a.wait || errors.As(err, &cfgErr) || time.Now().After(deadline)):
			ss.log.Error("cutover check", "error", err.Error())
			return res, false
		case err != nil:
			// Postgres or a broker did not answer (a failover): --wait rides it out.
			ss.log.Warn("cutover check could not be made; trying again", "attempt", attempt, "error", err.Error())
		case res.OK || !a.wait || time.Now().After(deadline):
			return res, true
		case tty:
			printWaitingOn(stderr, attempt, res)
		}
		if !backoff.Sleep(ss.ctx, 2*time.Second) {
			return res, false
		}
	}
}

// printWaitingOn names the first condition that does not hold yet.
func printWaitingOn(w io.Writer, attempt int, res cutover.Result) {
	if f := res.Failed(); len(f) > 0 {
		fmt.Fprintf(w, "attempt %d: waiting on %s: %s\n", attempt, conditionName(f[0]), f[0].Detail)
	}
}

// conditionName is a condition as the verdict names it: "outbox", or
// "group billing: legacy queue".
func conditionName(c cutover.Condition) string {
	if c.Group == "" {
		return c.Name
	}
	return "group " + c.Group + ": " + c.Name
}

// printVerdict prints one line per condition: the outbox's first, then
// each group's under its name and path.
func printVerdict(w io.Writer, r cutover.Result, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(r) //nolint:errcheck // stdout
		return
	}
	paths := map[string]cutover.Path{}
	for _, g := range r.Groups {
		paths[g.Name()] = g.Path
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range r.Conditions {
		verdict := "FAIL"
		if c.OK {
			verdict = "PASS"
		}
		group := "-"
		if c.Group != "" {
			group = fmt.Sprintf("%s (%s)", c.Group, paths[c.Group])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", verdict, group, c.Name, c.Detail)
	}
	tw.Flush()
	if r.OK {
		fmt.Fprintf(w, "READY: %s may read JetStream only\n", groupList(r.Groups))
		return
	}
	var why []string
	for _, c := range r.Failed() {
		why = append(why, conditionName(c))
	}
	fmt.Fprintf(w, "NOT READY: %s\n", strings.Join(why, "; "))
}

// groupList names the groups: "billing", "billing and ledger", "a, b and c".
func groupList(gs []cutover.Group) string {
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = g.Name()
	}
	if len(names) == 1 {
		return "group " + names[0]
	}
	return "groups " + strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
