package pgserver

import "syscall"

// sysProcAttr returns the process attributes of server child processes: run as cred (nil:
// as this process), in their own process group (so a terminal's ^C reaches only the test
// binary), and sent SIGKILL by the kernel when the thread that started them dies. Go applies
// Pdeathsig after the credential change (which would otherwise clear it), and Go never ends
// the threads of goroutines that are not locked to them, so in practice the signal comes when
// the test binary exits or is killed. A killed postmaster's backends notice its death and exit.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
