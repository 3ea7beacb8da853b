//go:build unix

package pgserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

const (
	// ReadyTimeout bounds how long a local server (or PgBouncer) may take to accept
	// connections after its process started (crash recovery included).
	ReadyTimeout = time.Minute
	// StopTimeout bounds an immediate shutdown before a stop falls back to SIGKILL.
	StopTimeout = 10 * time.Second
	// PortAttempts is how many free ports a start tries when another process takes the port
	// between its choice and the server's bind.
	PortAttempts = 3
)

// Run is one child process (a postmaster, PgBouncer, etcd, ...). A goroutine owned by the
// Run waits for the process and closes [Run.Exited], so it ends exactly when the process
// does. Its methods are safe for concurrent use.
type Run struct {
	// Cmd is the started command; read Cmd.Process, never call Wait.
	Cmd    *exec.Cmd
	exited chan struct{}
	err    error // Cmd.Wait's result; read only after exited is closed
}

// StartRun starts cmd and returns its Run, whose goroutine waits for the process. Errors:
// those of cmd.Start, wrapped.
func StartRun(cmd *exec.Cmd) (*Run, error) {
	// Pdeathsig fires when the forking thread ends. A caller's goroutine may be locked to a
	// thread that ends with it; a new goroutine never is, and its thread lives as long as the
	// process. This function waits for the goroutine, which owns nothing afterwards.
	started := make(chan error, 1)
	go func() { started <- cmd.Start() }()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("pgserver: start %s: %w", cmd.Path, err)
	}
	r := &Run{Cmd: cmd, exited: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.exited)
	}()
	return r, nil
}

// Exited returns a channel closed when the process has exited.
func (r *Run) Exited() <-chan struct{} { return r.exited }

// Err returns what waiting for the process returned (nil for exit status 0). Call it only
// after [Run.Exited] is closed.
func (r *Run) Err() error { return r.err }

// HasExited reports whether the process has exited.
func (r *Run) HasExited() bool {
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL to the process and waits until it has exited. Errors: a failed kill of
// a process still there.
func (r *Run) Kill() error {
	if err := r.Cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgserver: kill %s: %w", filepath.Base(r.Cmd.Path), err)
	}
	<-r.exited
	return nil
}

// stop shuts a postmaster down immediately (SIGQUIT), calls afterQuit (if not nil), and
// waits for it; after [StopTimeout] it sends SIGKILL and waits again. Errors: a signal that
// could not be sent to a process still there.
func (r *Run) stop(afterQuit func()) error {
	if err := r.Cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgserver: stop server: %w", err)
	}
	if afterQuit != nil {
		afterQuit()
	}
	timer := time.NewTimer(StopTimeout)
	defer timer.Stop()
	select {
	case <-r.exited:
		return nil
	case <-timer.C:
	}
	if err := r.Cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgserver: kill server: %w", err)
	}
	<-r.exited
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct TCP ports of 127.0.0.1 that were free a moment ago. Errors:
// a failed listen.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pgserver: free port: %w", err)
		}
		defer ln.Close() // held until all are chosen, so that they differ
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// LogTail returns the last lines (at most 4 KiB) of the file at path written from byte
// offset on, or a note saying why there are none.
func LogTail(path string, offset int64) string {
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
