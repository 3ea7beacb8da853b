//go:build unix

package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// startNode starts n's Patroni process. It fails if the cluster is closed or n runs.
func (c *PatroniCluster) startNode(n *patroniNode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("pgtest: patroni: the cluster is closed")
	}
	if n.proc != nil && !n.proc.HasExited() {
		return fmt.Errorf("pgtest: patroni: %s is running", n.name)
	}
	r, err := c.spawn(c.procs.patroni, n.name, filepath.Join(n.dir, "patroni.log"), []string{"HOME=" + n.dir},
		filepath.Join(n.dir, "patroni.json"))
	if err != nil {
		return err
	}
	n.proc = r
	return nil
}

// killNode kills n's Patroni process, then its postmaster (SIGKILL both), and waits until
// both are gone (the postmaster at most pgserver.StopTimeout).
func (c *PatroniCluster) killNode(n *patroniNode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	if n.proc != nil {
		errs = append(errs, n.proc.Kill())
		n.proc = nil
	}
	errs = append(errs, killPostmaster(filepath.Join(n.dir, "data")))
	return errors.Join(errs...)
}

// killPostmaster kills (SIGKILL) the postmaster of the data directory data, if its
// postmaster.pid names a live process whose command line names data, and waits until it is
// gone (or a zombie), at most pgserver.StopTimeout. Its backends exit on their own when they notice.
func killPostmaster(data string) error {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return nil // being written, or garbage: no process to kill
	}
	if args, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && !bytes.Contains(args, []byte(data)) {
		return nil // a stale pid file: the pid belongs to another process now
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("pgtest: patroni: kill postmaster %d: %w", pid, err)
	}
	deadline := time.Now().Add(pgserver.StopTimeout)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: patroni: postmaster %d still there %s after SIGKILL", pid, pgserver.StopTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// processGone reports whether process pid, which is not a child of this process, has exited:
// it no longer exists, or (Linux) it is a zombie its new parent has not reaped yet.
func processGone(pid int) bool {
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		// pid (comm) state ...: comm may hold spaces and parentheses, so take the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
			return stat[i+2] == 'Z'
		}
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
