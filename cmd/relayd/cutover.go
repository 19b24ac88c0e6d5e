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
	"time"

	"github.com/sethvargo/go-envconfig"
	"golang.org/x/term"

	"github.com/relayd/relayd/cutover"
	"github.com/relayd/relayd/internal/backoff"
)

const cutoverHelp = `Usage: relayd cutover check --consumer DURABLE [--queue LEGACY_QUEUE] [flags]

Says whether consumers may switch to JetStream exclusively. Prints each
condition with its numbers and PASS or FAIL:

  1. outbox: nothing pending (or parked) for the nats target
  2. relayd phases: every running relay in dual or nats, and in the
     table's phase once one is set (relayd phase)
  3. legacy queue (with --queue): 0 ready messages and 0 consumers
  4. the durable consumer, read fresh: NumPending 0 and NumAckPending 0
  5. quiescence: 1-4 keep holding and the stream's last sequence does not
     move for the quiet interval (default the consumer's AckWait, or its
     last BackOff step if longer)
  6. with --instances: every relayd answers the same /version

Exit status: 0 all pass, 1 any fails (or a service could not be reached
within --connect-timeout), 2 usage. Uses RELAY_DATABASE_URL,
RELAY_OUTBOX_TABLE, RELAY_NATS_URL, RELAY_NATS_STREAM and RELAY_AMQP_URL.
With routes to several streams, check each stream's consumer: --stream.

Flags:
`

// cutoverArgs are cutover check's flags.
type cutoverArgs struct {
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
	ss, code := openSession(stderr, env, 2, true, a.connect)
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
	if len(args) == 0 || (args[0] != "check" && !strings.HasPrefix(args[0], "-")) {
		fmt.Fprintln(stderr, "relayd cutover: want `relayd cutover check --consumer DURABLE` (see relayd cutover check --help)")
		return a, exitUsage, true
	}
	if args[0] == "check" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("cutover check", flag.ContinueOnError)
	connect := addCutoverFlags(fs, &a)
	fs.BoolVar(&a.asJSON, "json", false, "print the verdict as JSON")
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, cutoverHelp)); done {
		return a, code, true
	}
	a.connect = *connect
	if a.consumer == "" {
		fmt.Fprintln(stderr, "relayd cutover check: --consumer is required")
		return a, exitUsage, true
	}
	if !validCutoverArgs(fs.Name(), a, env, stderr) {
		return a, exitUsage, true
	}
	return a, exitOK, false
}

// addCutoverFlags adds the check's flags to fs, into a: cutover check's,
// which phase set nats takes too. It returns --connect-timeout.
func addCutoverFlags(fs *flag.FlagSet, a *cutoverArgs) *time.Duration {
	fs.StringVar(&a.consumer, "consumer", "", "the JetStream durable consumer that takes over (required)")
	fs.StringVar(&a.queue, "queue", "", "the legacy RabbitMQ queue it replaces")
	fs.StringVar(&a.stream, "stream", "", "the stream of the consumer, one a route names (default RELAY_NATS_STREAM)")
	fs.DurationVar(&a.quiet, "quiet-period", 0, "quiet interval (default: the consumer's AckWait or last BackOff step)")
	fs.BoolVar(&a.conservative, "conservative", false, "quiet interval AckWait x (MaxAckPending + 1)")
	fs.StringVar(&a.instances, "instances", "", "relayd metrics addresses host:port,... that must report one version")
	fs.BoolVar(&a.wait, "wait", false, "poll until every condition passes or --timeout")
	fs.DurationVar(&a.timeout, "timeout", 30*time.Minute, "with --wait, give up after this long")
	return connectTimeoutFlag(fs)
}

// validCutoverArgs checks the flags addCutoverFlags read, but --consumer;
// false: it has printed why (exit 2).
func validCutoverArgs(name string, a cutoverArgs, env envconfig.Lookuper, stderr io.Writer) bool {
	if strings.ContainsAny(a.stream, " \t.*>") {
		fmt.Fprintf(stderr, "relayd %s: --stream %q is not a valid stream name\n", name, a.stream)
		return false
	}
	if a.quiet < 0 || a.timeout <= 0 {
		fmt.Fprintf(stderr, "relayd %s: --quiet-period and --timeout must be positive\n", name)
		return false
	}
	if !checkConnectTimeout(name, a.connect, stderr) {
		return false
	}
	return a.queue == "" || amqpURLOK(env, stderr)
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
	ccfg = cutover.Config{
		DB: ss.pool, Table: ss.cfg.table, JS: ss.js, Stream: cmp.Or(a.stream, ss.cfg.NATSStream), Consumer: a.consumer,
		AMQPURL: ss.cfg.AMQPURL, AMQPTLS: tlsCfg, Queue: a.queue, QuietPeriod: a.quiet, Conservative: a.conservative, Instances: addrs,
	}
	if f, ok := stderr.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	if tty {
		ccfg.OnSample = func(elapsed, total time.Duration) {
			fmt.Fprintf(stderr, "\rquiet for %s of %s ", elapsed.Round(time.Second), total)
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
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				ss.log.Error("cutover check", "error", err.Error())
			}
			return res, false
		}
		if res.OK || !a.wait || time.Now().After(deadline) {
			return res, true
		}
		if tty {
			printWaitingOn(stderr, attempt, res)
		}
		if !backoff.Sleep(ss.ctx, 2*time.Second) {
			return res, false
		}
	}
}

// printWaitingOn names the first condition that does not hold yet.
func printWaitingOn(w io.Writer, attempt int, res cutover.Result) {
	for _, c := range res.Conditions {
		if !c.OK {
			fmt.Fprintf(w, "attempt %d: waiting on %s: %s\n", attempt, c.Name, c.Detail)
			return
		}
	}
}

func printVerdict(w io.Writer, r cutover.Result, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(r) //nolint:errcheck // stdout
		return
	}
	for _, c := range r.Conditions {
		verdict := "FAIL"
		if c.OK {
			verdict = "PASS"
		}
		fmt.Fprintf(w, "%-4s  %-18s  %s\n", verdict, c.Name, c.Detail)
	}
	if r.OK {
		fmt.Fprintln(w, "READY: consumers may switch to JetStream exclusively")
	} else {
		fmt.Fprintln(w, "NOT READY")
	}
}
