package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// parseFlags parses a command's flags and refuses positional arguments.
// --help returns flag.ErrHelp (exitCode prints the command's Usage); a
// usage error names the command by fs's name.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseFlagsArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return within(fs.Name(), nil, usagef("unexpected argument %q (see relayd %s --help)", fs.Arg(0), fs.Name()))
	}
	return nil
}

// parseFlagsArgs is parseFlags for a command that takes positional
// arguments (it checks them itself, in fs.Args()). Flags and positional
// arguments may come in any order: Go's flag package stops at the first
// positional one, and `relayd migrate status --json` would refuse --json.
// "--" ends the flags. A flag given twice is a usage error (see onceValue).
func parseFlagsArgs(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	flags, pos := splitArgs(args, fs)
	twice := ""
	restore := setOnce(fs, &twice)
	err := fs.Parse(flags)
	restore()
	if err == nil {
		err = fs.Parse(append([]string{"--"}, pos...)) // fs.Args() is pos
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return flag.ErrHelp
	case twice != "":
		err = usagef("--%s given twice: give it once (see relayd %s --help)", twice, fs.Name())
	default:
		err = usagef("%s (see relayd %s --help)", doubleDash(err.Error()), fs.Name())
	}
	return within(fs.Name(), nil, err)
}

// takeAction finds a command's action — its first positional argument —
// wherever it stands among the flags, and returns args without it ("" and
// args when there is none). sets are the flag sets of the command's
// actions: they say which flags take a value, so that a flag's value is not
// taken for the action. The caller checks the action and parses the rest
// with parseFlags or parseFlagsArgs.
func takeAction(args []string, sets ...*flag.FlagSet) (action string, rest []string) {
	_, at := scanArgs(args, sets...)
	if len(at) == 0 {
		return "", args
	}
	i := at[0]
	return args[i], append(append([]string{}, args[:i]...), args[i+1:]...)
}

// splitArgs separates args into fs's flags, each with its value, and the
// positional arguments, both in their order.
func splitArgs(args []string, fs *flag.FlagSet) (flags, pos []string) {
	flags, at := scanArgs(args, fs)
	for _, i := range at {
		pos = append(pos, args[i])
	}
	return flags, pos
}

// scanArgs reads args as the flag package reads a flag and its value, but
// goes on past positional arguments: it returns the flags with their values
// and the indexes of the positional arguments. A flag takes the next
// argument as its value when one of sets defines it, not as a boolean, and
// it has no "=value"; an unknown flag takes none (parsing it fails anyway).
// Every argument after "--" is positional.
func scanArgs(args []string, sets ...*flag.FlagSet) (flags []string, at []int) {
	for i := 0; i < len(args); i++ {
		s := args[i]
		switch {
		case s == "--":
			for j := i + 1; j < len(args); j++ {
				at = append(at, j)
			}
			return flags, at
		case len(s) < 2 || s[0] != '-':
			at = append(at, i)
		default:
			flags = append(flags, s)
			if !strings.Contains(s, "=") && takesValue(strings.TrimLeft(s, "-"), sets) && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		}
	}
	return flags, at
}

func takesValue(name string, sets []*flag.FlagSet) bool {
	for _, fs := range sets {
		if f := fs.Lookup(name); f != nil && !isBoolFlag(f.Value) {
			return true
		}
	}
	return false
}

func isBoolFlag(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// listFlag is a flag.Value meant to be given more than once, each time
// adding to a list: setOnce leaves it alone.
type listFlag interface {
	flag.Value
	IsList() bool
}

// errTwice is onceValue's refusal; parseFlagsArgs names the flag instead.
var errTwice = errors.New("given twice")

// onceValue refuses a second value for a flag: with "the last one wins", a
// flag repeated by a script or an alias (--reason a ... --reason b) would
// silently override the first.
type onceValue struct {
	flag.Value
	name  string
	set   bool
	twice *string // the flag given twice, for the message
}

func (v *onceValue) Set(s string) error {
	if v.set {
		*v.twice = v.name
		return errTwice
	}
	v.set = true
	return v.Value.Set(s)
}

func (v *onceValue) IsBoolFlag() bool { return isBoolFlag(v.Value) }

// setOnce wraps each of fs's flags, but lists, in a onceValue that names a
// flag given twice in *twice; restore puts the flags' values back, for the
// flag package's help and the callers' type assertions.
func setOnce(fs *flag.FlagSet, twice *string) (restore func()) {
	var wrapped []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if l, ok := f.Value.(listFlag); ok && l.IsList() {
			return
		}
		f.Value = &onceValue{Value: f.Value, name: f.Name, twice: twice}
		wrapped = append(wrapped, f)
	})
	return func() {
		for _, f := range wrapped {
			f.Value = f.Value.(*onceValue).Value
		}
	}
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
// Every command's help is built so: usage, what it does, then "Flags:" and
// this list.
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

// connectTimeoutUsage is --connect-timeout's line in the help.
const connectTimeoutUsage = "give up on a service that does not answer after this long (e.g. 2m to wait for a restart)"

// connectTimeoutFlag adds --connect-timeout to a one-shot command's flags.
func connectTimeoutFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("connect-timeout", connectTimeoutDefault, connectTimeoutUsage)
}

// checkConnectTimeout refuses a timeout that is not positive.
func checkConnectTimeout(d time.Duration) error {
	if d <= 0 {
		return usagef("--connect-timeout must be a positive duration, like 5s")
	}
	return nil
}
