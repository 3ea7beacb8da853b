//go:build unix

package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// readyTimeout bounds how long a local server may take to accept connections after its
	// process started (crash recovery included).
	readyTimeout = time.Minute
	// stopTimeout bounds an immediate shutdown before Close falls back to SIGKILL.
	stopTimeout = 10 * time.Second
	// portAttempts is how many free ports a local start tries when another process takes the
	// port between its choice and the server's bind.
	portAttempts = 3
)

// binaries are the PostgreSQL server programs a local server runs.
type binaries struct {
	dir, initdb, postgres string
}

var (
	binOnce  sync.Once
	bins     binaries
	binsErr  error
	userOnce sync.Once
	runCred  *syscall.Credential // nil unless the process runs as root
	runErr   error
)

// findBinaries locates initdb and postgres once per process: in PG_BIN, else on PATH, else in
// the newest /usr/lib/postgresql/<version>/bin or /usr/pgsql-<version>/bin.
func findBinaries() (binaries, error) {
	binOnce.Do(func() { bins, binsErr = lookBinaries() })
	return bins, binsErr
}

func lookBinaries() (binaries, error) {
	inDir := func(dir string) (binaries, bool) {
		b := binaries{dir: dir, initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
		return b, isExecutable(b.initdb) && isExecutable(b.postgres)
	}
	if dir := os.Getenv(EnvPGBin); dir != "" {
		if b, ok := inDir(dir); ok {
			return b, nil
		}
		return binaries{}, fmt.Errorf("pgtest: %s=%s does not hold both initdb and postgres", EnvPGBin, dir)
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		// Prefer the postgres next to initdb (same version), resolving Debian-style symlinks.
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			if b, ok := inDir(filepath.Dir(real)); ok {
				return b, nil
			}
		}
		if b, ok := inDir(filepath.Dir(initdb)); ok {
			return b, nil
		}
		if postgres, err := exec.LookPath("postgres"); err == nil {
			return binaries{dir: filepath.Dir(initdb), initdb: initdb, postgres: postgres}, nil
		}
	}
	var dirs []string
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	slices.SortFunc(dirs, func(a, b string) int { return slices.Compare(dirVersion(b), dirVersion(a)) }) // newest first
	for _, dir := range dirs {
		if b, ok := inDir(dir); ok {
			return b, nil
		}
	}
	return binaries{}, fmt.Errorf("pgtest: initdb and postgres not found in %s, PATH, /usr/lib/postgresql/*/bin or /usr/pgsql-*/bin (install the PostgreSQL server, or set %s)", EnvPGBin, EnvPGBin)
}

// dirVersion extracts the version of a binaries directory: "15" from
// /usr/lib/postgresql/15/bin, "9.6" from /usr/pgsql-9.6/bin.
func dirVersion(dir string) []int {
	base := filepath.Base(filepath.Dir(dir))
	base = strings.TrimPrefix(base, "pgsql-")
	var v []int
	for _, part := range strings.Split(base, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			break
		}
		v = append(v, n)
	}
	return v
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// runAsCredential returns the credential server processes run with: nil when this process is
// not root, else user postgres (or nobody if there is no postgres user), because initdb and
// postgres refuse to run as root.
func runAsCredential() (*syscall.Credential, error) {
	userOnce.Do(func() {
		if os.Geteuid() != 0 {
			return
		}
		for _, name := range []string{"postgres", "nobody"} {
			u, err := user.Lookup(name)
			if err != nil {
				continue
			}
			uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
			gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
			if err1 != nil || err2 != nil {
				continue
			}
			runCred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
			return
		}
		runErr = errors.New("pgtest: running as root, and neither user postgres nor user nobody exists to run the server as")
	})
	return runCred, runErr
}

// chownTo gives path to the run-as user when this process is root.
func chownTo(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// command prepares a child process that runs as cred (if not nil), in its own process group,
// killed by SIGKILL if this process dies first (Linux), with PG* and locale variables removed
// from its environment and LC_ALL=C. ctx kills it (context.Background for one that must
// outlive the call).
func command(ctx context.Context, cred *syscall.Credential, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=")
	})
	cmd.Env = append(env, "LC_ALL=C")
	cmd.SysProcAttr = sysProcAttr(cred)
	return cmd
}

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
func acquirePristine(ctx context.Context, b binaries, cred *syscall.Credential) (string, error) {
	pristine.mu.Lock()
	defer pristine.mu.Unlock()
	if pristine.dir == "" {
		dir, err := os.MkdirTemp("", "pgtest-initdb-*")
		if err != nil {
			return "", fmt.Errorf("pgtest: initdb: %w", err)
		}
		if err := chownTo(dir, cred); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("pgtest: initdb: %w", err)
		}
		cmd := command(ctx, cred, dir, b.initdb,
			"-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust",
			"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("pgtest: %s: %w\n%s", b.initdb, err, bytes.TrimSpace(out))
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

// holdPristine keeps the pristine cluster while Main runs (hold true), so that each server
// does not run initdb again, and lets it go afterwards (hold false).
func holdPristine(hold bool) error {
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
		return fmt.Errorf("pgtest: remove initdb cluster: %w", err)
	}
	return nil
}

// localServer is a postmaster run from local binaries in its own temp dir.
type localServer struct {
	bins    binaries
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
	run    *run       // the current postmaster; nil when stopped
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
func archiveSettings(dir string) []setting {
	return []setting{
		{"archive_mode", "on"},
		{"archive_command", "test ! -f " + dir + "/%f && cp %p " + dir + "/%f"},
		{"restore_command", "cp " + dir + "/%f %p"},
	}
}

// run is one postmaster process. A goroutine owned by the run waits for the process and
// closes exited, so it ends exactly when the process does.
type run struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // cmd.Wait's result; read only after exited is closed
}

func (r *run) hasExited() bool {
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

// startLocal starts a server from local binaries on a copy of the pristine cluster.
func startLocal(ctx context.Context, settings []setting, archive bool) (*Server, error) {
	b, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := runAsCredential()
	if err != nil {
		return nil, err
	}
	pdata, err := acquirePristine(ctx, b, cred)
	if err != nil {
		return nil, err
	}
	l := &localServer{bins: b, cred: cred, pristineRef: true}
	fail := func(err error) (*Server, error) {
		if l.dir != "" {
			os.RemoveAll(l.dir)
		}
		return nil, errors.Join(err, releasePristine())
	}
	if l.dir, err = os.MkdirTemp("", "pgtest-*"); err != nil {
		return fail(fmt.Errorf("pgtest: %w", err))
	}
	if err := chownTo(l.dir, cred); err != nil {
		return fail(fmt.Errorf("pgtest: %w", err))
	}
	if archive {
		l.archiveDir = filepath.Join(l.dir, "archive")
		if err := os.Mkdir(l.archiveDir, 0o700); err != nil {
			return fail(fmt.Errorf("pgtest: %w", err))
		}
		if err := chownTo(l.archiveDir, cred); err != nil {
			return fail(fmt.Errorf("pgtest: %w", err))
		}
		settings = append(settings, archiveSettings(l.archiveDir)...)
	}
	l.flags = commandFlags(settings)
	data := filepath.Join(l.dir, "data")
	if out, err := command(ctx, cred, l.dir, "cp", "-a", pdata, data).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgtest: copy cluster: %w\n%s", err, bytes.TrimSpace(out)))
	}
	base, err := l.startOnFreePort(ctx, data)
	if err != nil {
		return fail(err)
	}
	return &Server{kind: kindLocal, base: base, maintDB: "postgres", tplName: templateName, local: l}, nil
}

// startOnFreePort starts a postmaster on the data directory data (inside l.dir) on a free
// port of 127.0.0.1 with l.flags, trying another port when one is taken between its choice
// and the server's bind, and returns the URL of its postgres database. l.dir must exist.
func (l *localServer) startOnFreePort(ctx context.Context, data string) (*url.URL, error) {
	l.logPath = filepath.Join(l.dir, "log")
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		base := loopbackURL("127.0.0.1", port, url.User("postgres"))
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
		if attempt == portAttempts || !isBindError(l.logSince(logStart)) {
			return nil, err
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// freePorts returns n distinct TCP ports of 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pgtest: free port: %w", err)
		}
		defer ln.Close() // held until all are chosen, so that they differ
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

func isBindError(log string) bool {
	return strings.Contains(log, "could not bind") || strings.Contains(log, "could not create any TCP/IP sockets")
}

// start starts the postmaster and waits until it accepts connections; on failure it kills it
// and returns the error with the tail of its log. It returns the log offset at which this
// start's output begins. l.mu must be held.
func (l *localServer) start(ctx context.Context) (logStart int64, err error) {
	logf, err := os.OpenFile(l.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("pgtest: server log: %w", err)
	}
	if fi, err := logf.Stat(); err == nil {
		logStart = fi.Size()
	}
	// The postmaster outlives ctx, which only bounds the start.
	cmd := command(context.Background(), l.cred, l.dir, l.bins.postgres, l.args...)
	cmd.Stdout, cmd.Stderr = logf, logf // an *os.File goes to the child as is: no copying goroutine
	r, err := startRun(cmd)
	logf.Close()
	if err != nil {
		return logStart, err
	}
	l.run = r
	if err := waitAccepting(ctx, "postgres", l.url, readyTimeout, r.exited); err != nil {
		if errors.Is(err, errExited) {
			<-r.exited
			err = fmt.Errorf("%w: %w", err, r.err)
		}
		l.run = nil
		_ = r.stop(nil)
		return logStart, fmt.Errorf("%w\nserver log (%s):\n%s", err, l.logPath, l.logSince(logStart))
	}
	return logStart, nil
}

// startRun starts cmd and returns its run, whose goroutine waits for the process.
func startRun(cmd *exec.Cmd) (*run, error) {
	// Pdeathsig fires when the forking thread ends. A caller's goroutine may be locked to a
	// thread that ends with it; a new goroutine never is, and its thread lives as long as the
	// process. This function waits for the goroutine, which owns nothing afterwards.
	started := make(chan error, 1)
	go func() { started <- cmd.Start() }()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("pgtest: start %s: %w", cmd.Path, err)
	}
	r := &run{cmd: cmd, exited: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.exited)
	}()
	return r, nil
}

// kill sends SIGKILL to the process and waits until it has exited.
func (r *run) kill() error {
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgtest: kill %s: %w", filepath.Base(r.cmd.Path), err)
	}
	<-r.exited
	return nil
}

// stop shuts the postmaster down immediately (SIGQUIT), calls afterQuit (if not nil), and
// waits for the postmaster; after stopTimeout it sends SIGKILL and waits again.
func (r *run) stop(afterQuit func()) error {
	if err := r.cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgtest: stop server: %w", err)
	}
	if afterQuit != nil {
		afterQuit()
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-r.exited:
		return nil
	case <-timer.C:
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgtest: kill server: %w", err)
	}
	<-r.exited
	return nil
}

var errClosed = errors.New("pgtest: server is closed")

func (l *localServer) crash(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	r := l.run
	if r == nil {
		return errors.New("pgtest: crash: server is not running")
	}
	if err := r.cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgtest: crash: %w", err)
	}
	l.killPaused() // after SIGQUIT: the postmaster is in immediate shutdown and restarts nothing
	select {
	case <-r.exited:
		l.run = nil
		return nil
	case <-ctx.Done():
		return fmt.Errorf("pgtest: crash: %w", ctx.Err())
	}
}

func (l *localServer) restart(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	if l.run != nil {
		if !l.run.hasExited() {
			return errors.New("pgtest: restart: server is running; Crash it first")
		}
		l.run = nil // it died on its own
	}
	_, err := l.start(ctx)
	return err
}

func (l *localServer) isRunning() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closed && l.run != nil && !l.run.hasExited()
}

func (l *localServer) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	var errs []error
	if l.run != nil {
		errs = append(errs, l.run.stop(l.killPaused))
		l.run = nil
	}
	if err := os.RemoveAll(l.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: remove server dir: %w", err))
	}
	if l.pristineRef {
		errs = append(errs, releasePristine())
	}
	return errors.Join(errs...)
}

// logSince returns the last lines of the server log written from offset on.
func (l *localServer) logSince(offset int64) string { return logTail(l.logPath, offset) }

// logTail returns the last lines (at most 4 KiB) of the file at path written from offset on.
func logTail(path string, offset int64) string {
	const maxTail = 4 << 10
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > maxTail {
		offset = fi.Size() - maxTail
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "(no log: " + err.Error() + ")"
	}
	b, _ := io.ReadAll(f)
	return string(bytes.TrimSpace(b))
}
