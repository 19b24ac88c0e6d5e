package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

const versionHelp = `Usage: relayd version [--json]

Prints relayd's version and the Go release it was built with (relayd
--version prints the same).

Flags:
`

// versionCommand prints the version.
type versionCommand struct {
	*cli
	asJSON bool
}

func (c *versionCommand) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.BoolVar(&c.asJSON, "json", false, `print {"version": ..., "go_version": ...}`)
	return fs
}

func (c *versionCommand) Usage() string { return withFlagDefaults(c.flags(), versionHelp) }

func (c *versionCommand) Run(_ context.Context, args []string) error {
	if err := parseFlags(c.flags(), args); err != nil {
		return err
	}
	if c.asJSON {
		return printJSON(c.stdout, map[string]string{"version": version, "go_version": runtime.Version()})
	}
	fmt.Fprintf(c.stdout, "relayd %s (%s)\n", version, runtime.Version())
	return nil
}
