//go:build unix && !linux

package pgserver

import "syscall"

// sysProcAttr returns the process attributes of server child processes: run as cred (nil:
// as this process), in their own process group. Outside Linux there is no parent-death
// signal: a server outlives a test binary that is killed before it can Close it.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
