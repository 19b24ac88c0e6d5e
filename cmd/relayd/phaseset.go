package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/phase"
)

const phaseSetHelp = `Usage: relayd phase set amqp|dual|nats [--reason TEXT] [--by NAME] [--force] [flags]

Records the phase every relay of this outbox that RELAY_TARGETS does not
pin switches to within seconds: amqp (runbook step 0), dual (step 1) or
nats (step 4). It is recorded in the phase's history with who and why.

Moving to nats first runs the cutover check for the consumer groups the
flags below name (as relayd cutover check does: --dual-read,
--rolling-upgrade or --consumer) and refuses, exit 1, unless every
condition of every group holds and every durable consumer of their streams
is a group or --exclude'd; --force skips the check and records the change
as forced. Moving back from nats prints what the rollback needs:
the rows written meanwhile went to JetStream only (relayd replay).

The change is made only if the phase is still the one read before the
check: a change made meanwhile fails it. Setting the phase it already has
records nothing. Exit status: 0 done (or already so), 1 refused or failed,
2 usage.

Flags:
`

// phaseSetArgs are phase set's argument and flags.
type phaseSetArgs struct {
	to          phase.Name
	reason, by  string
	force       bool
	cutoverArgs // for a move to nats
}

func cmdPhaseSet(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	a, code, done := parsePhaseSetArgs(args, stdout, stderr, env)
	if done {
		return code
	}
	check := a.to == phase.NATS && !a.force
	ss, code := connectSession("phase set", stderr, env, 2, check, a.connect)
	if ss == nil {
		return code
	}
	defer ss.close()
	ctx, pool, table := ss.ctx, ss.pool, ss.cfg.table
	before, set, err := phase.Read(ctx, pool, table)
	if err != nil {
		if notMigrated(err) {
			err = fmt.Errorf("%w (the outbox has no phase tables yet: run relayd migrate)", err)
		}
		ss.log.Error("read the phase", "error", err.Error())
		return exitFailure
	}
	if set && before.Phase == a.to {
		fmt.Fprintf(stdout, "already %s: nothing recorded\n", a.to)
		return exitOK
	}
	if check && !cutoverHolds(ss, a.cutoverArgs, stdout, stderr) {
		return exitFailure
	}
	return recordPhase(ss, a, before, set, stdout, stderr)
}

// recordPhase records the move from before (set: a phase was set), unless
// another change came since, and says what follows from it.
func recordPhase(ss *session, a phaseSetArgs, before phase.Change, set bool, stdout, stderr io.Writer) int {
	ctx, pool, table := ss.ctx, ss.pool, ss.cfg.table
	change := phase.Change{Phase: a.to, ChangedBy: a.by, Reason: a.reason, Forced: a.to == phase.NATS && a.force}
	at, err := phase.Set(ctx, pool, table, change, before, set)
	if errors.Is(err, phase.ErrChanged) {
		fmt.Fprintf(stderr, "relayd phase set: not recorded: %v. Another change came first: see relayd phase --history, and run again if the move still stands.\n", err)
		return exitFailure
	}
	if errors.Is(err, phase.ErrUnknown) {
		fmt.Fprintf(stderr, "relayd phase set: the move to %s may or may not be recorded (%v). See relayd phase --history, and run again if the phase is not %s.\n", a.to, err, a.to)
		return exitFailure
	}
	if err != nil {
		ss.log.Error("set the phase", "error", err.Error())
		return exitFailure
	}
	from := "not set"
	if set {
		from = string(before.Phase)
	}
	fmt.Fprintf(stdout, "phase %s -> %s, recorded at %s by %s\n", from, describe(a.to), at.UTC().Format(time.RFC3339), a.by)
	if change.Forced {
		fmt.Fprintf(stdout, "forced: the cutover check was not run (%s not checked); the history records the change as forced\n",
			strings.Join([]string{cutover.CondOutbox, cutover.CondPhases, cutover.CondQueue, cutover.CondConsumer, cutover.CondQuiet}, ", "))
	}
	// The change is made: what follows only informs.
	if set && before.Phase == phase.NATS {
		if h, err := phase.History(ctx, pool, table); err != nil {
			ss.log.Warn("read the phase history for the rollback's window", "error", err.Error())
		} else {
			printRollback(stdout, h)
		}
	}
	if running, err := phase.Running(ctx, pool, table); err != nil {
		ss.log.Warn("read the running relays", "error", err.Error())
	} else {
		printFollowing(stdout, running, a.to)
	}
	return exitOK
}

// cutoverHolds runs the cutover check as cutover check does and prints its
// verdict; when a condition fails it prints why the move is refused.
func cutoverHolds(ss *session, a cutoverArgs, stdout, stderr io.Writer) bool {
	ccfg, tty, err := cutoverConfig(ss, a, stderr)
	if err != nil {
		ss.log.Error("cutover check", "error", err.Error())
		return false
	}
	res, ok := awaitCutover(ss, ccfg, a, tty, stderr)
	if !ok {
		return false
	}
	printVerdict(stdout, res, false)
	if !res.OK {
		fmt.Fprintln(stderr, refusal(res))
	}
	return res.OK
}

// parsePhaseSetArgs reads the phase and the flags; done says to exit with
// code. The phase may come before the flags, among them or after them.
func parsePhaseSetArgs(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) (a phaseSetArgs, code int, done bool) {
	fs, connect := newPhaseSetFlags(&a)
	if code, done := parseFlagsArgs(fs, args, stdout, stderr, withFlagDefaults(fs, phaseSetHelp)); done {
		return a, code, true
	}
	var arg string
	rest := fs.Args()
	if len(rest) > 0 {
		arg, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		fmt.Fprintf(stderr, "relayd phase set: unexpected argument %q (see relayd phase set --help)\n", rest[0])
		return a, exitUsage, true
	}
	if arg == "" {
		fmt.Fprintln(stderr, "relayd phase set: want the phase: amqp, dual or nats (see relayd phase set --help)")
		return a, exitUsage, true
	}
	to, err := phase.Parse(arg)
	if err != nil {
		fmt.Fprintf(stderr, "relayd phase set: argument %q: want amqp, dual or nats (see relayd phase set --help)\n", arg)
		return a, exitUsage, true
	}
	a.to, a.connect = to, *connect
	// The check's flags mean something only where the check runs.
	var stray string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "reason", "by", "force", "connect-timeout":
		default:
			if stray == "" && (to != phase.NATS || a.force) {
				stray = f.Name
			}
		}
	})
	switch {
	case stray != "":
		fmt.Fprintf(stderr, "relayd phase set: --%s is for the cutover check, which only phase set nats without --force runs (see relayd phase set --help)\n", stray)
		return a, exitUsage, true
	case !validCutoverArgs(fs, &a.cutoverArgs, env, stderr):
		return a, exitUsage, true
	case to == phase.NATS && !a.force && len(a.groups) == 0:
		fmt.Fprintln(stderr, "relayd phase set: name the consumer groups (--dual-read, --rolling-upgrade or --consumer): moving to nats runs the cutover check for each (or --force skips the check; see relayd phase set --help)")
		return a, exitUsage, true
	}
	if a.by == "" {
		a.by = whoami()
	}
	a.allConsumers = true // phase 4 leaves no group unchecked
	return a, exitOK, false
}

// whoami is user@host, for the history.
func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

// refusal is the paragraph saying why phase set nats did not move.
func refusal(res cutover.Result) string {
	var failed []string
	for _, c := range res.Failed() {
		what := fmt.Sprintf("condition %q", c.Name)
		if c.Group != "" {
			what += " of group " + c.Group
		}
		failed = append(failed, fmt.Sprintf("%s (%s)", what, c.Detail))
	}
	what := failed[0] + " does not hold"
	if len(failed) > 1 {
		what = strings.Join(failed, " and ") + " do not hold"
	}
	return "relayd phase set nats: refused, nothing recorded: the cutover check's " + what + ". " +
		"Phase nats sends new rows to JetStream only, and the check says when no consumer group would be left behind on the legacy side. " +
		"Wait until it holds (add --wait, or run relayd cutover check), or move anyway with --force (the history records the change as forced)."
}

// printRollback says what leaving nats needs: the rows of the latest nats
// period reached JetStream only.
func printRollback(w io.Writer, h []phase.Change) {
	p, ok := phase.LastPeriod(h, phase.NATS)
	if !ok {
		return
	}
	start := p.Start.UTC().Format(time.RFC3339)
	end := "now"
	if !p.End.IsZero() {
		end = p.End.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, `
Rolling back from nats: the rows written since phase 4 began (%s) until
this change (%s) went to JetStream only; RabbitMQ and its consumers never
got them. To send them to RabbitMQ:

  relayd replay --dry-run    # the latest nats period by default: %s to %s
  relayd replay

(--since, --from-seq and --to-seq narrow the window; docs/migration.md,
"Rolling back: relayd replay".)
`, start, end, start, end)
}

// printFollowing names the running relays that will not take the new
// phase by themselves: those RELAY_TARGETS pins to another.
func printFollowing(w io.Writer, running []phase.Instance, to phase.Name) {
	var pinned []string
	for _, in := range phase.Astray(running, to) {
		if in.Pinned {
			pinned = append(pinned, fmt.Sprintf("%s (%s)", in.Instance, in.Phase))
		}
	}
	fmt.Fprintf(w, "relays that follow the table switch within %s (relayd phase lists them)\n", phase.BeatEvery)
	if len(pinned) > 0 {
		fmt.Fprintf(w, "pinned by RELAY_TARGETS, these keep their phase until it is unset or changed and they restart: %s\n", strings.Join(pinned, ", "))
	}
}
