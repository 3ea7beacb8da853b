//go:build unix

package pgtest

import (
	"errors"
	"fmt"
	"syscall"
)

// pauseWALSenders stops the processes pids (WAL senders of l) with SIGSTOP and remembers them
// for resumeWALSenders and killPaused.
func (l *localServer) pauseWALSenders(pids []int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.run == nil || l.run.hasExited() {
		return errors.New("pgtest: pause WAL senders: server is closed or not running")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("pgtest: pause WAL sender %d: %w", pid, err)
		}
		l.paused = append(l.paused, pid)
	}
	return nil
}

// resumeWALSenders sends SIGCONT to the paused WAL senders and forgets them. A sender that
// has exited since (ESRCH) is not an error.
func (l *localServer) resumeWALSenders() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, pid := range l.paused {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("pgtest: resume WAL sender %d: %w", pid, err))
		}
	}
	l.paused = nil
	return errors.Join(errs...)
}

// killPaused kills (SIGKILL) the paused WAL senders and forgets them: a stopped process would
// hold the postmaster's shutdown for seconds, and one resumed would send the WAL it held back.
// l.mu must be held; the postmaster must already be shutting down.
func (l *localServer) killPaused() {
	for _, pid := range l.paused {
		_ = syscall.Kill(pid, syscall.SIGKILL) // ESRCH: gone already
	}
	l.paused = nil
}
