//go:build !linux

package main

import "os/exec"

// dieWithBench is a no-op where the kernel has no parent-death signal.
func dieWithBench(*exec.Cmd) {}
