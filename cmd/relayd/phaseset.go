package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

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

// phaseSetCommand is relayd phase set.
type phaseSetCommand struct {
	*cli
	phaseSetArgs
}

func (c *phaseSetCommand) Usage() string {
	fs, _ := newPhaseSetFlags(&phaseSetArgs{})
	return withFlagDefaults(fs, phaseSetHelp)
}

func (c *phaseSetCommand) Run(ctx context.Context, args []string) error {
	if err := c.parse(args); err != nil {
		return err
	}
	check := c.to == phase.NATS && !c.force
	ss, err := openSession(ctx, c.cli, sessionOptions{Conns: readerConns, NATS: check, ConnectTimeout: c.connect})
	if err != nil {
		return err
	}
	defer ss.close()
	before, set, err := phase.Read(ss.ctx, ss.pool, ss.cfg.table)
	if err != nil {
		return logged("read the phase", err)
	}
	if set && before.Phase == c.to {
		fmt.Fprintf(c.stdout, "already %s: nothing recorded\n", c.to)
		return nil
	}
	return c.record(ss, before, set)
}

// record records the move from before (set: a phase was set) through
// cutover.SetPhase — to nats only once the cutover check passes, unless
// forced — unless another change came since, and says what follows from it.
func (c *phaseSetCommand) record(ss *session, before phase.Change, set bool) error {
	ctx, pool, table := ss.ctx, ss.pool, ss.cfg.table
	change := phase.Change{Phase: c.to, ChangedBy: c.by, Reason: c.reason, Forced: c.to == phase.NATS && c.force}
	ccfg := cutover.Config{DB: pool, Table: table}
	var check cutover.Checker // runs only for a move to nats, not forced
	var checkErr error
	if c.to == phase.NATS && !c.force {
		var tty bool
		var err error
		if ccfg, tty, err = cutoverConfig(ss, c.cutoverArgs, c.stderr); err != nil {
			return logged("cutover check", err)
		}
		check = func(_ context.Context, cfg cutover.Config) (cutover.Result, error) {
			// As cutover check does, --wait included; the verdict printed.
			res, err := awaitCutover(ss, cfg, c.cutoverArgs, tty, c.stderr)
			if checkErr = err; err == nil {
				printVerdict(c.stdout, res, false)
			}
			return res, err
		}
	}
	at, res, err := cutover.SetPhase(ctx, ccfg, change, before, set, check)
	switch {
	case checkErr != nil:
		return checkErr
	case errors.Is(err, cutover.ErrNotReady):
		return within("phase set nats", nil, errors.New(refusal(res)))
	case errors.Is(err, phase.ErrChanged):
		return advicef("not recorded: %v. Another change came first: see relayd phase --history, and run again if the move still stands.", err)
	case errors.Is(err, phase.ErrUnknown):
		return advicef("the move to %s may or may not be recorded (%v). See relayd phase --history, and run again if the phase is not %s.", c.to, err, c.to)
	case err != nil:
		return logged("set the phase", err)
	}
	stdout := c.stdout
	from := "not set"
	if set {
		from = string(before.Phase)
	}
	fmt.Fprintf(stdout, "phase %s -> %s, recorded at %s by %s\n", from, describe(c.to), at.UTC().Format(time.RFC3339), c.by)
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
		printFollowing(stdout, running, c.to)
	}
	return nil
}

// parse reads the phase and the flags. The phase may come before the
// flags, among them or after them.
func (c *phaseSetCommand) parse(args []string) error {
	fs, connect := newPhaseSetFlags(&c.phaseSetArgs)
	if err := parseFlagsArgs(fs, args); err != nil {
		return err
	}
	var arg string
	rest := fs.Args()
	if len(rest) > 0 {
		arg, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		return usagef("unexpected argument %q (see relayd phase set --help)", rest[0])
	}
	if arg == "" {
		return usagef("want the phase: amqp, dual or nats (see relayd phase set --help)")
	}
	to, err := phase.Parse(arg)
	if err != nil {
		return usagef("argument %q: want amqp, dual or nats (see relayd phase set --help)", arg)
	}
	c.to, c.connect = to, *connect
	// The check's flags mean something only where the check runs.
	var stray string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "reason", "by", "force", "connect-timeout":
		default:
			if stray == "" && (to != phase.NATS || c.force) {
				stray = f.Name
			}
		}
	})
	if stray != "" {
		return usagef("--%s is for the cutover check, which only phase set nats without --force runs (see relayd phase set --help)", stray)
	}
	if err := validCutoverArgs(&c.cutoverArgs, c.env); err != nil {
		return err
	}
	if to == phase.NATS && !c.force && len(c.groups) == 0 {
		return usagef("name the consumer groups (--dual-read, --rolling-upgrade or --consumer): moving to nats runs the cutover check for each (or --force skips the check; see relayd phase set --help)")
	}
	if c.by == "" {
		c.by = whoami()
	}
	return nil
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

// refusal is the paragraph saying why phase set nats did not move (its
// line starts "relayd phase set nats: ").
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
	return "refused, nothing recorded: the cutover check's " + what + ". " +
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
