package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// parseFlags parses a subcommand's flags and refuses positional arguments;
// done reports that the command should exit with code (help printed, or a
// usage error).
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, help string) (code int, done bool) {
	if code, done := parseFlagsArgs(fs, args, stdout, stderr, help); done {
		return code, done
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "relayd %s: unexpected argument %q (see relayd %s --help)\n", fs.Name(), fs.Arg(0), fs.Name())
		return exitUsage, true
	}
	return 0, false
}

// parseFlagsArgs is parseFlags for a command that takes positional
// arguments (it checks them itself).
func parseFlagsArgs(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, help string) (code int, done bool) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, help)
			return exitOK, true
		}
		fmt.Fprintf(stderr, "relayd %s: %s (see relayd %s --help)\n", fs.Name(), doubleDash(err.Error()), fs.Name())
		return exitUsage, true
	}
	return 0, false
}

// doubleDash rewrites the flag package's errors, which name a flag -name
// whichever way it was typed, in the --name style of relayd's help.
func doubleDash(msg string) string {
	for _, p := range []string{"not defined: -", "for flag -", "for -", "needs an argument: -"} {
		if i := strings.Index(msg, p); i >= 0 {
			return msg[:i+len(p)] + "-" + msg[i+len(p):]
		}
	}
	return msg
}

// withFlagDefaults appends fs's flags, with their defaults, to help, each
// as --name, its usage on the next line (the flag package prints -name).
func withFlagDefaults(fs *flag.FlagSet, help string) string {
	var b strings.Builder
	b.WriteString(help)
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		b.WriteString("  --" + f.Name)
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t"))
		if g, ok := f.Value.(flag.Getter); ok && !isZero(f.DefValue) {
			if _, isString := g.Get().(string); isString {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(&b, " (default %v)", f.DefValue)
			}
		}
		b.WriteString("\n")
	})
	return b.String()
}

func isZero(def string) bool {
	switch def {
	case "", "0", "false", "0s":
		return true
	}
	return false
}

// connectTimeoutDefault is how long a one-shot command waits for Postgres
// (and NATS): an engineer is waiting for the answer, and RELAY_STARTUP_TIMEOUT
// is for a relay starting alongside its services.
const connectTimeoutDefault = 5 * time.Second

// connectTimeoutFlag adds --connect-timeout to a one-shot command's flags.
func connectTimeoutFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("connect-timeout", connectTimeoutDefault, "give up on a service that does not answer after this long (e.g. 2m to wait for a restart)")
}

// connectTimeoutHelp documents the flag where a help text lists flags by hand.
const connectTimeoutHelp = `  --connect-timeout D   give up on Postgres (or NATS) if it does not answer
                        within D (default 5s); 2m, say, waits for a restart
`

// checkConnectTimeout refuses a timeout that is not positive.
func checkConnectTimeout(name string, d time.Duration, stderr io.Writer) bool {
	if d <= 0 {
		fmt.Fprintf(stderr, "relayd %s: --connect-timeout must be a positive duration, like 5s\n", name)
		return false
	}
	return true
}
