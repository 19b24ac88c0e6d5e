package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/schema"
)

const phaseHelp = `Usage: relayd phase [show] [--history] [--json] [--connect-timeout D]
       relayd phase set amqp|dual|nats [flags]   (see relayd phase set --help)

Prints the migration phase the relays of this outbox share: amqp (runbook
step 0, legacy only), dual (step 1, dual write) or nats (step 4, new only),
when and by whom it was set and why; then the running relays, each with the
phase it runs, whether RELAY_TARGETS pins it (a pinned relay does not
follow the table) and when it last reported, flagging those whose phase is
not the table's. Needs only RELAY_DATABASE_URL (and RELAY_OUTBOX_TABLE).
Exit status 0 when it was read, 1 when Postgres could not be read.

Flags:
`

// newPhaseSetFlags is phase set's flag set, into a; it returns
// --connect-timeout. phase reads it to tell the flags that take a value, to
// find its action among them; TestPhaseSetFlagsMatch holds it to phase
// set's own.
func newPhaseSetFlags(a *phaseSetArgs) (*flag.FlagSet, *time.Duration) {
	fs := flag.NewFlagSet("phase set", flag.ContinueOnError)
	fs.StringVar(&a.reason, "reason", "", "why: kept in the history")
	fs.StringVar(&a.by, "by", "", "who, for the history (default user@host)")
	fs.BoolVar(&a.force, "force", false, "move to nats without the cutover check (recorded as forced)")
	connect := addCutoverFlags(fs, &a.cutoverArgs)
	return fs, connect
}

// stepNames are the runbook's names of the phases (docs/migration.md).
var stepNames = map[phase.Name]string{phase.AMQP: "legacy only", phase.Dual: "dual write", phase.NATS: "new only"}

// describe is a phase with its runbook step: "dual (runbook step 1, dual write)".
func describe(n phase.Name) string {
	return fmt.Sprintf("%s (runbook step %d, %s)", n, n.Step(), stepNames[n])
}

// phaseNotSet is what the relays do while no phase is set.
const phaseNotSet = "not set: each relay runs its RELAY_TARGETS (default amqp,nats)"

// phaseJSON is the table's phase in --json; null while none is set.
type phaseJSON struct {
	phase.Change
	Step int `json:"step"`
}

// relayJSON is a running relay in --json.
type relayJSON struct {
	phase.Instance
	SeenAgoSeconds float64 `json:"seen_ago_seconds"`
	// Differs: its phase is not the table's (false while none is set).
	Differs bool `json:"differs"`
}

// phaseState is what phase show and status print of the phase.
type phaseState struct {
	Phase   *phaseJSON     `json:"phase"`
	Relays  []relayJSON    `json:"relays"`
	History []phase.Change `json:"history,omitempty"`
}

// readPhaseState reads the table's phase, the running relays and, with
// history, every change.
func readPhaseState(ctx context.Context, db *pgxpool.Pool, table schema.Table, history bool) (phaseState, error) {
	st := phaseState{Relays: []relayJSON{}}
	c, set, err := phase.Read(ctx, db, table)
	if err != nil {
		return st, err
	}
	if set {
		st.Phase = &phaseJSON{Change: c, Step: c.Phase.Step()}
	}
	running, err := phase.Running(ctx, db, table)
	if err != nil {
		return st, err
	}
	for _, in := range running {
		st.Relays = append(st.Relays, relayJSON{Instance: in, SeenAgoSeconds: in.Age.Seconds(), Differs: set && in.Phase != c.Phase})
	}
	if history {
		if st.History, err = phase.History(ctx, db, table); err != nil {
			return st, err
		}
	}
	return st, nil
}

// phaseCommand is relayd phase [show], and relayd phase set's parent.
type phaseCommand struct {
	*cli
	history, asJSON bool
	connectTimeout  time.Duration
}

func (c *phaseCommand) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("phase", flag.ContinueOnError)
	fs.BoolVar(&c.history, "history", false, "list every change of the phase, oldest first")
	fs.BoolVar(&c.asJSON, "json", false, "one JSON document, for scripts")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
	return fs
}

func (c *phaseCommand) Usage() string { return withFlagDefaults(c.flags(), phaseHelp) }

func (c *phaseCommand) action(name string) (command, bool) {
	if name == "set" {
		return &phaseSetCommand{cli: c.cli}, true
	}
	return nil, false
}

func (c *phaseCommand) Run(ctx context.Context, args []string) error {
	fs := c.flags()
	set := &phaseSetCommand{cli: c.cli}
	setFlags, _ := newPhaseSetFlags(&set.phaseSetArgs)
	action, args := takeAction(args, fs, setFlags)
	switch {
	case action == "set":
		return within("phase set", set, set.Run(ctx, args))
	case action != "" && !isAction("phase", action):
		return usagef("unknown action %q: want show or set (see relayd phase --help)", action)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkConnectTimeout(c.connectTimeout); err != nil {
		return err
	}
	ss, err := openSession(ctx, c.cli, sessionOptions{Conns: readerConns, ConnectTimeout: c.connectTimeout})
	if err != nil {
		return err
	}
	defer ss.close()
	st, err := readPhaseState(ss.ctx, ss.pool, ss.cfg.table, c.history)
	if err != nil {
		return logged("read the phase", err)
	}
	if c.asJSON {
		return printJSON(c.stdout, struct {
			Table string `json:"table"`
			phaseState
		}{ss.cfg.table.String(), st})
	}
	fmt.Fprintf(c.stdout, "outbox %s\n", ss.cfg.table)
	printPhase(c.stdout, st)
	if c.history {
		printHistory(c.stdout, st.History)
	}
	return nil
}

// printPhase writes the table's phase and the running relays.
func printPhase(w io.Writer, st phaseState) {
	if st.Phase == nil {
		fmt.Fprintf(w, "phase  %s\n", phaseNotSet)
	} else {
		p := st.Phase
		fmt.Fprintf(w, "phase  %s\n", describe(p.Phase))
		fmt.Fprintf(w, "set    %s by %s", p.ChangedAt.UTC().Format(time.RFC3339), p.ChangedBy)
		if p.Reason != "" {
			fmt.Fprintf(w, ": %s", p.Reason)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	if len(st.Relays) == 0 {
		fmt.Fprintln(w, "no relay reports its phase (none running, or relays from before the phase table)")
		return
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RELAY\tPHASE\tPINNED\tVERSION\tSEEN\t")
	differ := 0
	for _, r := range st.Relays {
		pinned, note := "no", ""
		if r.Pinned {
			pinned = "yes"
		}
		if r.Differs {
			differ++
			note = "<- not the table's phase (" + string(st.Phase.Phase) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s\n", r.Instance.Instance, r.Phase, pinned, r.Version, r.Age.Round(100*time.Millisecond), note)
	}
	tw.Flush()
	for line := range strings.Lines(b.String()) { // the note column pads the others
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	if differ > 0 {
		fmt.Fprintf(w, "\n%d of %d relays do not run the table's phase: a pinned one keeps its RELAY_TARGETS (unset it and restart); one that follows the table switches within %s\n",
			differ, len(st.Relays), phase.BeatEvery)
	}
}

// printHistory writes every change, oldest first.
func printHistory(w io.Writer, h []phase.Change) {
	fmt.Fprintln(w, "\nhistory (oldest first)")
	if len(h) == 0 {
		fmt.Fprintln(w, "no change recorded")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHANGED AT\tPHASE\tBY\tFORCED\tREASON")
	for _, c := range h {
		forced, reason := "-", c.Reason
		if c.Forced {
			forced = "forced"
		}
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.ChangedAt.UTC().Format(time.RFC3339), c.Phase, c.ChangedBy, forced, reason)
	}
	tw.Flush()
}
