//go:build unix

package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// pristine is the process-wide cluster made by one initdb, which each local server copies.
// It is removed when no local server uses it, unless Main holds it for the whole run.
var pristine struct {
	mu   sync.Mutex
	dir  string // temp dir holding data/; "" before initdb
	refs int    // local servers started and not closed
	held bool   // Main is running
}

// acquirePristine returns the data directory of the pristine cluster, running initdb first if
// there is none, and counts one more user of it; the caller must call releasePristine.
func acquirePristine(ctx context.Context, b Binaries, cred *syscall.Credential) (string, error) {
	pristine.mu.Lock()
	defer pristine.mu.Unlock()
	if pristine.dir == "" {
		dir, err := os.MkdirTemp("", "pgtest-initdb-*")
		if err != nil {
			return "", fmt.Errorf("pgserver: initdb: %w", err)
		}
		if err := ChownTo(dir, cred); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("pgserver: initdb: %w", err)
		}
		cmd := Command(ctx, cred, dir, b.Initdb,
			"-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust",
			"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("pgserver: %s: %w\n%s", b.Initdb, err, bytes.TrimSpace(out))
		}
		if err := allowReplication(filepath.Join(dir, "data", "pg_hba.conf")); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		pristine.dir = dir
	}
	pristine.refs++
	return filepath.Join(pristine.dir, "data"), nil
}

// releasePristine counts one user of the pristine cluster less, and removes it when it has
// none and Main does not hold it.
func releasePristine() error {
	pristine.mu.Lock()
	defer pristine.mu.Unlock()
	pristine.refs--
	return removeUnusedPristine()
}

// HoldPristine keeps the pristine cluster (the one initdb of the process, which every local
// server copies) while a test main runs (hold true), so that each server does not run initdb
// again, and lets it go afterwards (hold false): it is then removed once no local server uses
// it. Errors: a failed removal. Safe for concurrent use.
func HoldPristine(hold bool) error {
	pristine.mu.Lock()
	defer pristine.mu.Unlock()
	pristine.held = hold
	return removeUnusedPristine()
}

func removeUnusedPristine() error {
	if pristine.refs > 0 || pristine.held || pristine.dir == "" {
		return nil
	}
	dir := pristine.dir
	pristine.dir = ""
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("pgserver: remove initdb cluster: %w", err)
	}
	return nil
}

// Local is a postmaster run from local [Binaries] in its own temp dir, started by
// [StartLocal] or [Local.StartStandby]. Its methods are safe for concurrent use.
type Local struct {
	bins    Binaries
	cred    *syscall.Credential
	dir     string // temp dir: data/ (PGDATA), log, and the Unix socket
	logPath string
	url     string   // maintenance database URL, for readiness checks
	flags   []string // the settings' command-line flags ("-c", "name=value", ...)
	args    []string // postgres's command line, flags included
	// pristineRef is true when the server counts as a user of the pristine cluster (a copy of
	// it), false for a standby (a base backup of its primary).
	pristineRef bool

	mu     sync.Mutex // guards run, closed and paused
	run    *Run       // the current postmaster; nil when stopped
	closed bool
	// paused are the pids of the WAL senders PauseWALSenders stopped (SIGSTOP) and nothing
	// has resumed or killed since.
	paused []int
	// archiveDir is the WAL archive (WALArchive) of the server or, for a standby, of its
	// primary; "" if none. It lives in the primary's dir.
	archiveDir string
}

// archiveSettings are the settings of a server whose WAL archive is dir: every finished
// segment and history file is copied there (once: a file already archived is kept), and
// recovery reads from it.
func archiveSettings(dir string) []Setting {
	return []Setting{
		{"archive_mode", "on"},
		{"archive_command", "test ! -f " + dir + "/%f && cp %p " + dir + "/%f"},
		{"restore_command", "cp " + dir + "/%f %p"},
	}
}

// StartLocal starts a server from local [Binaries] ([FindBinaries]) on a copy of the
// pristine cluster (one initdb per process: superuser postgres, trust authentication, UTF8,
// locale C), listening on 127.0.0.1 and a free port, with settings as command-line flags
// (pass [DefaultSettings] first for the usual ones). With archive it also gets a WAL archive
// ([Local.ArchiveDir]). When this process is root the server runs as [RunAsCredential]. It
// returns once the server accepts connections, with the URL of its postgres database; ctx
// bounds the start only. The caller must [Local.Close] it; it is also killed (SIGKILL) if
// this process dies (Linux). Errors: no binaries, a failed initdb or copy, a start that
// fails (with the tail of the server log).
func StartLocal(ctx context.Context, settings []Setting, archive bool) (*Local, *url.URL, error) {
	b, err := FindBinaries()
	if err != nil {
		return nil, nil, err
	}
	cred, err := RunAsCredential()
	if err != nil {
		return nil, nil, err
	}
	pdata, err := acquirePristine(ctx, b, cred)
	if err != nil {
		return nil, nil, err
	}
	l := &Local{bins: b, cred: cred, pristineRef: true}
	fail := func(err error) (*Local, *url.URL, error) {
		if l.dir != "" {
			os.RemoveAll(l.dir)
		}
		return nil, nil, errors.Join(err, releasePristine())
	}
	if l.dir, err = os.MkdirTemp("", "pgtest-*"); err != nil {
		return fail(fmt.Errorf("pgserver: %w", err))
	}
	if err := ChownTo(l.dir, cred); err != nil {
		return fail(fmt.Errorf("pgserver: %w", err))
	}
	if archive {
		l.archiveDir = filepath.Join(l.dir, "archive")
		if err := os.Mkdir(l.archiveDir, 0o700); err != nil {
			return fail(fmt.Errorf("pgserver: %w", err))
		}
		if err := ChownTo(l.archiveDir, cred); err != nil {
			return fail(fmt.Errorf("pgserver: %w", err))
		}
		settings = append(settings, archiveSettings(l.archiveDir)...)
	}
	l.flags = Flags(settings)
	data := filepath.Join(l.dir, "data")
	if out, err := Command(ctx, cred, l.dir, "cp", "-a", pdata, data).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgserver: copy cluster: %w\n%s", err, bytes.TrimSpace(out)))
	}
	base, err := l.startOnFreePort(ctx, data)
	if err != nil {
		return fail(err)
	}
	return l, base, nil
}

// startOnFreePort starts a postmaster on the data directory data (inside l.dir) on a free
// port of 127.0.0.1 with l.flags, trying another port when one is taken between its choice
// and the server's bind, and returns the URL of its postgres database. l.dir must exist.
func (l *Local) startOnFreePort(ctx context.Context, data string) (*url.URL, error) {
	l.logPath = filepath.Join(l.dir, "log")
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		base := LoopbackURL("127.0.0.1", port, url.User("postgres"))
		l.url = base.String()
		l.args = append([]string{
			"-D", data,
			"-c", "listen_addresses=127.0.0.1",
			"-c", "port=" + strconv.Itoa(port),
			"-c", "unix_socket_directories=" + l.dir,
		}, l.flags...)
		l.mu.Lock()
		logStart, err := l.start(ctx)
		l.mu.Unlock()
		if err == nil {
			return base, nil
		}
		if attempt == PortAttempts || !IsBindError(l.logSince(logStart)) {
			return nil, err
		}
	}
}

// start starts the postmaster and waits until it accepts connections; on failure it kills it
// and returns the error with the tail of its log. It returns the log offset at which this
// start's output begins. l.mu must be held.
func (l *Local) start(ctx context.Context) (logStart int64, err error) {
	logf, err := os.OpenFile(l.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("pgserver: server log: %w", err)
	}
	if fi, err := logf.Stat(); err == nil {
		logStart = fi.Size()
	}
	// The postmaster outlives ctx, which only bounds the start.
	cmd := Command(context.Background(), l.cred, l.dir, l.bins.Postgres, l.args...)
	cmd.Stdout, cmd.Stderr = logf, logf // an *os.File goes to the child as is: no copying goroutine
	r, err := StartRun(cmd)
	logf.Close()
	if err != nil {
		return logStart, err
	}
	l.run = r
	if err := WaitAccepting(ctx, "postgres", l.url, ReadyTimeout, r.Exited()); err != nil {
		if errors.Is(err, ErrExited) {
			<-r.Exited()
			err = fmt.Errorf("%w: %w", err, r.Err())
		}
		l.run = nil
		_ = r.stop(nil)
		return logStart, fmt.Errorf("%w\nserver log (%s):\n%s", err, l.logPath, l.logSince(logStart))
	}
	return logStart, nil
}

var errClosed = errors.New("pgserver: server is closed")

// Crash shuts the server down the way `pg_ctl stop -m immediate` does (SIGQUIT to the
// postmaster: no checkpoint, so the next start runs crash recovery), kills the WAL senders
// [Local.PauseWALSenders] paused, and returns once the postmaster has exited. Errors: the
// server is closed or not running; ctx's error if it ends first.
func (l *Local) Crash(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	r := l.run
	if r == nil {
		return errors.New("pgserver: crash: server is not running")
	}
	if err := r.Cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgserver: crash: %w", err)
	}
	l.killPaused() // after SIGQUIT: the postmaster is in immediate shutdown and restarts nothing
	select {
	case <-r.Exited():
		l.run = nil
		return nil
	case <-ctx.Done():
		return fmt.Errorf("pgserver: crash: %w", ctx.Err())
	}
}

// Restart starts the server again on the same data directory, port and settings after
// [Local.Crash] (or after it died), and returns once it accepts connections (at most
// [ReadyTimeout], less if ctx ends first). Errors: the server is closed or still running;
// the start error with the tail of the server log.
func (l *Local) Restart(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	if l.run != nil {
		if !l.run.HasExited() {
			return errors.New("pgserver: restart: server is running; Crash it first")
		}
		l.run = nil // it died on its own
	}
	_, err := l.start(ctx)
	return err
}

// IsRunning reports whether the server is neither closed nor stopped (crashed, or died).
func (l *Local) IsRunning() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closed && l.run != nil && !l.run.HasExited()
}

// Close stops the server (immediate shutdown, SIGKILL after [StopTimeout]), removes its
// directory, and lets go of the pristine cluster. It must be called once; later calls find
// nothing to stop. Errors: a failed stop or removal, joined.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	var errs []error
	if l.run != nil {
		errs = append(errs, l.run.stop(l.killPaused))
		l.run = nil
	}
	if err := os.RemoveAll(l.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgserver: remove server dir: %w", err))
	}
	if l.pristineRef {
		errs = append(errs, releasePristine())
	}
	return errors.Join(errs...)
}

// logSince returns the last lines of the server log written from offset on.
func (l *Local) logSince(offset int64) string { return LogTail(l.logPath, offset) }

// ArchiveDir returns the directory of the server's WAL archive (see [StartLocal]) or, for a
// standby, of its primary's; "" if it has none.
func (l *Local) ArchiveDir() string { return l.archiveDir }
