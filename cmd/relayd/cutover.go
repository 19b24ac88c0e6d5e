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

func cmdCutover(args []string, stdout, stderr io.Writer, env envconfig.Lookuper) int {
	if len(args) == 0 || (args[0] != "check" && !strings.HasPrefix(args[0], "-")) {
		fmt.Fprintln(stderr, "relayd cutover: want `relayd cutover check --consumer DURABLE` (see relayd cutover check --help)")
		return exitUsage
	}
	if args[0] == "check" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("cutover check", flag.ContinueOnError)
	consumer := fs.String("consumer", "", "the JetStream durable consumer that takes over (required)")
	queue := fs.String("queue", "", "the legacy RabbitMQ queue it replaces")
	quiet := fs.Duration("quiet-period", 0, "quiet interval (default: the consumer's AckWait or last BackOff step)")
	conservative := fs.Bool("conservative", false, "quiet interval AckWait x (MaxAckPending + 1)")
	instances := fs.String("instances", "", "relayd metrics addresses host:port,... that must report one version")
	wait := fs.Bool("wait", false, "poll until every condition passes or --timeout")
	timeout := fs.Duration("timeout", 30*time.Minute, "with --wait, give up after this long")
	asJSON := fs.Bool("json", false, "print the verdict as JSON")
	connectTimeout := connectTimeoutFlag(fs)
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, cutoverHelp)); done {
		return code
	}
	if *consumer == "" {
		fmt.Fprintln(stderr, "relayd cutover check: --consumer is required")
		return exitUsage
	}
	if *quiet < 0 || *timeout <= 0 {
		fmt.Fprintln(stderr, "relayd cutover check: --quiet-period and --timeout must be positive")
		return exitUsage
	}
	if !checkConnectTimeout(fs.Name(), *connectTimeout, stderr) {
		return exitUsage
	}
	if *queue != "" && !amqpURLOK(env, stderr) {
		return exitUsage
	}
	ss, code := openSession(stderr, env, 2, true, *connectTimeout)
	if ss == nil {
		return code
	}
	defer ss.close()
	cfg, log, ctx, pool, js := ss.cfg, ss.log, ss.ctx, ss.pool, ss.js
	tlsCfg, err := cfg.amqpTLS()
	if err != nil {
		log.Error("cutover check", "error", err.Error())
		return exitFailure
	}
	var addrs []string
	if *instances != "" {
		addrs = strings.Split(*instances, ",")
	}
	tty := false
	if f, ok := stderr.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	ccfg := cutover.Config{
		DB: pool, Table: cfg.table, JS: js, Stream: cfg.NATSStream, Consumer: *consumer,
		AMQPURL: cfg.AMQPURL, AMQPTLS: tlsCfg, Queue: *queue, QuietPeriod: *quiet, Conservative: *conservative, Instances: addrs,
	}
	if tty {
		ccfg.OnSample = func(elapsed, total time.Duration) {
			fmt.Fprintf(stderr, "\rquiet for %s of %s ", elapsed.Round(time.Second), total)
		}
	}
	deadline := time.Now().Add(*timeout)
	for attempt := 1; ; attempt++ {
		res, err := cutover.Check(ctx, ccfg)
		if tty && ccfg.OnSample != nil {
			fmt.Fprint(stderr, "\r\033[K")
		}
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return exitFailure
			}
			log.Error("cutover check", "error", err.Error())
			return exitFailure
		}
		if res.OK || !*wait || time.Now().After(deadline) {
			printVerdict(stdout, res, *asJSON)
			if res.OK {
				return exitOK
			}
			return exitFailure
		}
		if tty {
			for _, c := range res.Conditions {
				if !c.OK {
					fmt.Fprintf(stderr, "attempt %d: waiting on %s: %s\n", attempt, c.Name, c.Detail)
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return exitFailure
		case <-time.After(2 * time.Second):
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
