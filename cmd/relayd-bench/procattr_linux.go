package main

import (
	"os/exec"
	"syscall"
)

// dieWithBench makes a relayd child die with the benchmark, so an
// interrupted or crashed run leaves no relay behind.
func dieWithBench(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
