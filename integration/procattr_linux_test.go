package integration

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes a relayd child process die with the test binary, so a
// test run that panics or times out leaves no relay running behind it.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
