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

// cutoverCommand is relayd cutover: its one action is check.
type cutoverCommand struct{ *cli }

func (c *cutoverCommand) Usage() string { return (&cutoverCheckCommand{}).Usage() }

func (c *cutoverCommand) action(name string) (command, bool) {
	if name == "check" {
		return &cutoverCheckCommand{cli: c.cli}, true
	}
	return nil, false
}

func (c *cutoverCommand) Run(ctx context.Context, args []string) error {
	check := &cutoverCheckCommand{cli: c.cli}
	fs, _ := check.flags()
	action, args := takeAction(args, fs)
	switch action {
	case "check":
		return within("cutover check", check, check.Run(ctx, args))
	case "":
		// The help, or a usage error for a flag.
		if err := parseFlags(fs, args); err != nil {
			return within("cutover check", check, err)
		}
	}
	return usagef("want `relayd cutover check --dual-read DURABLE` (see relayd cutover check --help)")
}

// cutoverCheckCommand is relayd cutover check.
type cutoverCheckCommand struct {
	*cli
	cutoverArgs
}

// flags is the check's flag set, into c; it returns --connect-timeout.
func (c *cutoverCheckCommand) flags() (*flag.FlagSet, *time.Duration) {
	fs := flag.NewFlagSet("cutover check", flag.ContinueOnError)
	connect := addCutoverFlags(fs, &c.cutoverArgs)
	fs.BoolVar(&c.asJSON, "json", false, "print the verdict as JSON")
	fs.BoolVar(&c.allConsumers, "all-consumers", false, "every durable consumer of the groups' streams must be a group or --exclude'd (as phase set nats requires)")
	return fs, connect
}

func (c *cutoverCheckCommand) Usage() string {
	fs, _ := c.flags()
	return withFlagDefaults(fs, cutoverHelp)
}

func (c *cutoverCheckCommand) Run(ctx context.Context, args []string) error {
	if err := c.parse(args); err != nil {
		return err
	}
	ss, err := openSession(ctx, c.cli, sessionOptions{Conns: readerConns, NATS: true, ConnectTimeout: c.connect})
	if err != nil {
		return err
	}
	defer ss.close()
	ccfg, tty, err := cutoverConfig(ss, c.cutoverArgs, c.stderr)
	if err != nil {
		return logged("cutover check", err)
	}
	// Once, or with --wait until every condition passes or --timeout.
	res, err := awaitCutover(ss, ccfg, c.cutoverArgs, tty, c.stderr)
	if err != nil {
		return err
	}
	printVerdict(c.stdout, res, c.asJSON)
	if !res.OK {
		return errReported
	}
	return nil
}

// parse reads and checks the flags.
func (c *cutoverCheckCommand) parse(args []string) error {
	fs, connect := c.flags()
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c.connect = *connect
	if err := validCutoverArgs(&c.cutoverArgs, c.env); err != nil {
		return err
	}
	if len(c.exclude) > 0 && !c.allConsumers {
		return usagef("--exclude goes with --all-consumers (see relayd cutover check --help)")
	}
	if len(c.groups) == 0 {
		return usagef("name a group: --dual-read, --rolling-upgrade or --consumer (see relayd cutover check --help)")
	}
	return nil
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
// --consumer/--queue into the groups.
func validCutoverArgs(a *cutoverArgs, env envconfig.Lookuper) error {
	if a.stream != "" && !validNATSName(a.stream) {
		return usagef("--stream %q is not a valid stream name", a.stream)
	}
	switch {
	case a.queue != "" && a.consumer == "":
		return usagef("--queue goes with --consumer; for several groups, --dual-read or --rolling-upgrade DURABLE:QUEUE")
	case a.consumer != "":
		spec := a.consumer
		if a.queue != "" {
			spec += ":" + a.queue
		}
		if err := (groupPath{&a.groups, cutover.RollingUpgrade}).Set(spec); err != nil {
			return usagef("--consumer: %v", err)
		}
	}
	if err := a.groups.unique(); err != nil {
		return usagef("%v", err)
	}
	if a.quiet < 0 || a.timeout <= 0 {
		return usagef("--quiet-period and --timeout must be positive")
	}
	if err := checkConnectTimeout(a.connect); err != nil {
		return err
	}
	if a.groups.withQueue() {
		return amqpURLVar(env)
	}
	return nil
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

// awaitCutover checks once, or with --wait until every condition passes or
// --timeout. Its error is a check that could not be made (logged), or a
// signal (silent).
func awaitCutover(ss *session, ccfg cutover.Config, a cutoverArgs, tty bool, stderr io.Writer) (cutover.Result, error) {
	deadline := time.Now().Add(a.timeout)
	for attempt := 1; ; attempt++ {
		res, err := cutover.Check(ss.ctx, ccfg)
		if tty && ccfg.OnSample != nil {
			fmt.Fprint(stderr, "\r\033[K")
		}
		var cfgErr *cutover.ConfigError
		switch {
		case errors.Is(err, context.Canceled):
			return res, &silentError{err}
		case err != nil && (!a.wait || errors.As(err, &cfgErr) || time.Now().After(deadline)):
			return res, logged("cutover check", err)
		case err != nil:
			// Postgres or a broker did not answer (a failover): --wait rides it out.
			ss.log.Warn("cutover check could not be made; trying again", "attempt", attempt, "error", err.Error())
		case res.OK || !a.wait || time.Now().After(deadline):
			return res, nil
		case tty:
			printWaitingOn(stderr, attempt, res)
		}
		if !backoff.Sleep(ss.ctx, 2*time.Second) {
			return res, &silentError{ss.ctx.Err()}
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
