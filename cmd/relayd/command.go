package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/backfill"
)

// A command is one of relayd's commands, or an action of one that is a
// command of its own (phase set, outbox parked). Run gets the arguments
// after its name and returns nil or an error; exitCode alone turns that
// into the exit status and what stderr says. Usage is its help: the one
// text that relayd COMMAND --help (or -h) and relayd help COMMAND print.
type command interface {
	Run(ctx context.Context, args []string) error
	Usage() string
}

// withActions is a command whose actions are commands of their own, for
// relayd help COMMAND ACTION.
type withActions interface {
	action(name string) (command, bool)
}

// cli is what every command runs with: its output, its environment and,
// once it has read the configuration, its logger, through which exitCode
// logs a failure as the command would.
type cli struct {
	stdout, stderr io.Writer
	env            envconfig.Lookuper
	log            *slog.Logger
}

// usageError is a command used wrongly — a flag, an argument, a value:
// exit 2, on one line naming the command.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// advice is a failure (exit 1) told in whole sentences: what happened, and
// what the operator does next.
type advice struct{ msg string }

func (e *advice) Error() string { return e.msg }

func advicef(format string, args ...any) error {
	return &advice{msg: fmt.Sprintf(format, args...)}
}

// asConfigError makes err a configuration error (configError, exit 2,
// printed "relayd: config: ..."), if it is not one already.
func asConfigError(err error) error {
	if _, ok := errors.AsType[*configError](err); ok || err == nil {
		return err
	}
	return &configError{msg: err.Error()}
}

// loggedError is a failure logged through the command's logger, as
// relayd run logs one: exit 1.
type loggedError struct {
	msg   string
	attrs []any
	err   error
}

func (e *loggedError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *loggedError) Unwrap() error { return e.err }

// logged is err, to be logged as msg with attrs and the error.
func logged(msg string, err error, attrs ...any) error {
	return &loggedError{msg: msg, attrs: attrs, err: err}
}

// silentError exits 1 and prints nothing: the command's own report said
// why (a FAIL, a problem), or there is nowhere to say it (stdout closed).
type silentError struct{ err error }

func (e *silentError) Error() string { return e.err.Error() }
func (e *silentError) Unwrap() error { return e.err }

// errReported: the command's report, printed, says it failed.
var errReported = &silentError{errors.New("the report says so")}

// errNoAction: the command was given nothing to do. Its usage goes to
// stderr, exit 2.
var errNoAction = errors.New("nothing to do")

// commandError says which command an error is of: the name its line
// starts with ("relayd phase set: ..."), and the command whose usage
// --help prints. The innermost one counts.
type commandError struct {
	name string
	cmd  command // nil: the name only
	err  error
}

func (e *commandError) Error() string { return e.err.Error() }
func (e *commandError) Unwrap() error { return e.err }

// within marks err as name's (and cmd's, unless nil); nil stays nil.
func within(name string, cmd command, err error) error {
	if err == nil {
		return nil
	}
	return &commandError{name: name, cmd: cmd, err: err}
}

// origin is the innermost name and command err is marked with.
func origin(err error) (name string, cmd command) {
	for {
		ce, ok := errors.AsType[*commandError](err)
		if !ok {
			return name, cmd
		}
		name, err = ce.name, ce.err
		if ce.cmd != nil {
			cmd = ce.cmd
		}
	}
}

// exitCode is the one place a command's outcome becomes relayd's exit
// status and what it prints: nil 0; --help, the command's usage on stdout,
// 0; nothing to do, its usage on stderr, 2; a usage or configuration
// error (or backfill sharing a queue it may not), 2; any other failure, 1.
// A line names the command once, here: "relayd status: ...", or
// "relayd: config: ..." for the configuration, which every command shares.
func (c *cli) exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	name, cmd := origin(err)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(c.stdout, cmd.Usage())
		return exitOK
	case errors.Is(err, errNoAction):
		fmt.Fprint(c.stderr, cmd.Usage())
		return exitUsage
	}
	code := exitFailure
	_, usage := errors.AsType[*usageError](err)
	_, config := errors.AsType[*configError](err)
	if usage || config || errors.Is(err, backfill.ErrOtherConsumers) {
		code = exitUsage
	}
	if _, ok := errors.AsType[*silentError](err); ok {
		return code
	}
	if le, ok := errors.AsType[*loggedError](err); ok {
		c.logger().Error(le.msg, append(le.attrs, "error", le.err.Error())...)
		return code
	}
	if config {
		fmt.Fprintf(c.stderr, "relayd: config: %v\n", err)
		return code
	}
	for _, e := range lines(err) {
		fmt.Fprintln(c.stderr, commandPrefix(name)+e.Error())
	}
	return code
}

// lines are the errors of err printed a line each: those errors.Join
// joined (status --check's breaches), or err.
func lines(err error) []error {
	for {
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			return e.Unwrap()
		case *commandError:
			err = e.err
		default:
			return []error{err}
		}
	}
}

// commandPrefix starts a command's one-line message: "relayd status: ".
func commandPrefix(name string) string {
	if name == "" {
		return "relayd: "
	}
	return "relayd " + name + ": "
}

// logger is the command's logger, or before it had one, relayd's default.
func (c *cli) logger() *slog.Logger {
	if c.log == nil {
		return slog.New(slog.NewTextHandler(c.stderr, nil))
	}
	return c.log
}

// config loads the configuration, through env (tail and routes check
// answer RELAY_DATABASE_URL for themselves), and the command's logger. It
// sets GOMAXPROCS too: here, after the flags, so that a bad value does
// not stand between an operator and --help.
func (c *cli) config(env envconfig.Lookuper) (*config, error) {
	n, err := procs(env)
	var cfg *config
	if err == nil {
		cfg, err = loadConfig(context.Background(), env)
	}
	if err != nil {
		return nil, asConfigError(err)
	}
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	c.log = newLogger(cfg, c.stderr)
	return cfg, nil
}
