//go:build !linux

package testenv

import "os/exec"

// dieWithTest: no parent-death signal outside Linux; t.Cleanup kills cmd.
func dieWithTest(*exec.Cmd) {}
