package testenv

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes cmd die when the test process does, even by SIGKILL.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
