package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

const versionHelp = `Usage: relayd version [--json]

Prints relayd's version and the Go release it was built with (relayd
--version prints the same).

Flags:
`

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, `print {"version": ..., "go_version": ...}`)
	if code, done := parseFlags(fs, args, stdout, stderr, withFlagDefaults(fs, versionHelp)); done {
		return code
	}
	if *asJSON {
		return printJSON(stdout, map[string]string{"version": version, "go_version": runtime.Version()})
	}
	fmt.Fprintf(stdout, "relayd %s (%s)\n", version, runtime.Version())
	return exitOK
}
