package testkit

import (
	"os/exec"
	"syscall"
)

// dieWithTest asks the kernel to send cmd's process SIGKILL when its parent thread ends (see
// StartChild), keeping any other attribute cmd sets.
func dieWithTest(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
