//go:build unix

package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// replicationHBA is the pg_hba.conf line that lets pg_basebackup and a standby's WAL receiver
// connect to a local server for replication.
const replicationHBA = "host replication all 127.0.0.1/32 trust"

// allowReplication makes sure the pg_hba.conf at path (of the pristine cluster) accepts
// replication connections from 127.0.0.1 with trust authentication. initdb -A trust writes
// such a line itself (PostgreSQL 10 and later); if it is missing, allowReplication appends
// replicationHBA. An earlier line cannot shadow it: "all" in the database column does not
// match replication connections.
func allowReplication(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgserver: pg_hba.conf: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 5 && f[0] == "host" && f[1] == "replication" && (f[2] == "all" || f[2] == "postgres") &&
			f[3] == "127.0.0.1/32" && f[4] == "trust" {
			return nil
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgserver: pg_hba.conf: %w", err)
	}
	_, err = fmt.Fprintf(f, "\n# added by pgtest for StartStandby\n%s\n", replicationHBA)
	if err := errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("pgserver: pg_hba.conf: %w", err)
	}
	return nil
}

// StartStandby takes a base backup of the running server l, whose postgres database is at
// primary, into a fresh temp dir with pg_basebackup (standby.signal and primary_conninfo
// written by -R), then starts a postmaster on it with l's settings on a free port. It returns
// the standby (which the caller must [Local.Close]) and the URL of its postgres database.
// Errors: no pg_basebackup, a failed backup or start.
func (l *Local) StartStandby(ctx context.Context, primary *url.URL) (*Local, *url.URL, error) {
	basebackup := filepath.Join(l.bins.Dir, "pg_basebackup")
	if !IsExecutable(basebackup) {
		var err error
		if basebackup, err = exec.LookPath("pg_basebackup"); err != nil {
			return nil, nil, fmt.Errorf("pgserver: start standby: pg_basebackup is neither in %s nor on PATH", l.bins.Dir)
		}
	}
	sl := &Local{bins: l.bins, cred: l.cred, flags: l.flags, archiveDir: l.archiveDir}
	var err error
	if sl.dir, err = os.MkdirTemp("", "pgtest-standby-*"); err != nil {
		return nil, nil, fmt.Errorf("pgserver: start standby: %w", err)
	}
	fail := func(err error) (*Local, *url.URL, error) {
		os.RemoveAll(sl.dir)
		return nil, nil, err
	}
	if err := ChownTo(sl.dir, sl.cred); err != nil {
		return fail(fmt.Errorf("pgserver: start standby: %w", err))
	}
	data := filepath.Join(sl.dir, "data")
	cmd := Command(ctx, sl.cred, sl.dir, basebackup,
		"-D", data, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync", "--no-password",
		"-h", primary.Hostname(), "-p", primary.Port(), "-U", primary.User.Username())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgserver: start standby: %s: %w\n%s", basebackup, err, bytes.TrimSpace(out)))
	}
	base, err := sl.startOnFreePort(ctx, data)
	if err != nil {
		return fail(fmt.Errorf("pgserver: start standby: %w", err))
	}
	return sl, base, nil
}

// PauseWALSenders stops the processes pids (WAL senders of l) with SIGSTOP and remembers them
// for ResumeWALSenders and killPaused.
func (l *Local) PauseWALSenders(pids []int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.run == nil || l.run.HasExited() {
		return errors.New("pgserver: pause WAL senders: server is closed or not running")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("pgserver: pause WAL sender %d: %w", pid, err)
		}
		l.paused = append(l.paused, pid)
	}
	return nil
}

// ResumeWALSenders sends SIGCONT to the paused WAL senders and forgets them. A sender that
// has exited since (ESRCH) is not an error.
func (l *Local) ResumeWALSenders() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, pid := range l.paused {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("pgserver: resume WAL sender %d: %w", pid, err))
		}
	}
	l.paused = nil
	return errors.Join(errs...)
}

// killPaused kills (SIGKILL) the paused WAL senders and forgets them: a stopped process would
// hold the postmaster's shutdown for seconds, and one resumed would send the WAL it held back.
// l.mu must be held; the postmaster must already be shutting down.
func (l *Local) killPaused() {
	for _, pid := range l.paused {
		_ = syscall.Kill(pid, syscall.SIGKILL) // ESRCH: gone already
	}
	l.paused = nil
}
