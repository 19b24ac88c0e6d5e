package main

import (
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
  2. legacy queue (with --queue): 0 ready messages and 0 consumers
  3. the durable consumer, read fresh: NumPending 0 and NumAckPending 0
  4. quiescence: 1-3 keep holding and the stream's last sequence does not
     move for the quiet interval (default the consumer's AckWait, or its
     last BackOff step if longer)
  5. with --instances: every relayd answers the same /version

Exit status: 0 all pass, 1 any fails (or a service could not be reached
within --connect-timeout), 2 usage. Uses RELAY_DATABASE_URL,
RELAY_OUTBOX_TABLE, RELAY_NATS_URL, RELAY_NATS_STREAM and RELAY_AMQP_URL.

Flags:
`

// cutoverArgs are cutover check's flags.
type cutoverArgs struct {
	consumer, queue, instances string
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
	ccfg, err := cutoverConfig(ss, a)
	if err != nil {
		ss.log.Error("cutover check", "error", err.Error())
		return exitFailure
	}
	tty := false
	if f, ok := stderr.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	if tty {
		ccfg.OnSample = func(elapsed, total time.Duration) {
			fmt.Fprintf(stderr, "\rquiet for %s of %s ", elapsed.Round(time.Second), total)
		}
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
	fs.StringVar(&a.consumer, "consumer", "", "the JetStream durable consumer that takes over (required)")
	fs.StringVar(&a.queue, "queue", "", "the legacy RabbitMQ queue it replaces")
	fs.DurationVar(&a.quiet, "quiet-period", 0, "quiet interval (default: the consumer's AckWait or last BackOff step)")
	fs.BoolVar(&a.conservative, "conservative", false, "quiet interval AckWait x (MaxAckPending + 1)")
	fs.StringVar(&a.instances, "instances", "", "relayd metrics addresses host:port,... that must report one version")
	fs.BoolVar(&a.wait, "wait", false, "poll until every condition passes or --timeout")
	fs.DurationVar(&a.timeout, "timeout", 30*time.Minute, "with --wait, give up after this long")
	fs.BoolVar(&a.asJSON, "json", false, "print the verdict as JSON")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, cutoverHelp)); done {
		return a, code, true
	}
	a.connect = *connectTimeout
	if a.consumer == "" {
		fmt.Fprintln(stderr, "relayd cutover check: --consumer is required")
		return a, exitUsage, true
	}
	if a.quiet < 0 || a.timeout <= 0 {
		fmt.Fprintln(stderr, "relayd cutover check: --quiet-period and --timeout must be positive")
		return a, exitUsage, true
	}
	if !checkConnectTimeout(fs.Name(), a.connect, stderr) {
		return a, exitUsage, true
	}
	if a.queue != "" && !amqpURLOK(env, stderr) {
		return a, exitUsage, true
	}
	return a, exitOK, false
}

// cutoverConfig is cutover.Config for the session and flags.
func cutoverConfig(ss *session, a cutoverArgs) (cutover.Config, error) {
	tlsCfg, err := ss.cfg.amqpTLS()
	if err != nil {
		return cutover.Config{}, err
	}
	var addrs []string
	if a.instances != "" {
		addrs = strings.Split(a.instances, ",")
	}
	return cutover.Config{
		DB: ss.pool, Table: ss.cfg.table, JS: ss.js, Stream: ss.cfg.NATSStream, Consumer: a.consumer,
		AMQPURL: ss.cfg.AMQPURL, AMQPTLS: tlsCfg, Queue: a.queue, QuietPeriod: a.quiet, Conservative: a.conservative, Instances: addrs,
	}, nil
}

// checkCutover checks once, or with --wait until every condition passes or
// --timeout, and prints the verdict; it returns the exit code.
func checkCutover(ss *session, ccfg cutover.Config, a cutoverArgs, tty bool, stdout, stderr io.Writer) int {
	deadline := time.Now().Add(a.timeout)
	for attempt := 1; ; attempt++ {
		res, err := cutover.Check(ss.ctx, ccfg)
		if tty && ccfg.OnSample != nil {
			fmt.Fprint(stderr, "\r\033[K")
		}
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return exitFailure
			}
			ss.log.Error("cutover check", "error", err.Error())
			return exitFailure
		}
		if res.OK || !a.wait || time.Now().After(deadline) {
			printVerdict(stdout, res, a.asJSON)
			if res.OK {
				return exitOK
			}
			return exitFailure
		}
		if tty {
			printWaitingOn(stderr, attempt, res)
		}
		if !backoff.Sleep(ss.ctx, 2*time.Second) {
			return exitFailure
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
