//go:build unix

package pgtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// patroniProcs are a cluster's processes other than the members, and what starts members.
type patroniProcs struct {
	cred    *syscall.Credential
	patroni string // the patroni and patronictl programs
	ctl     string
	etcd    *pgserver.Run
	// janitor runs patroniJanitor; janitorIn is the write end of its stdin, which only this
	// process holds.
	janitor   *pgserver.Run
	janitorIn io.WriteCloser
}

// patroniJanitor is the shell script of the janitor process. It blocks reading its stdin, a
// pipe whose write end only the test binary holds, so the read ends when the test binary
// exits or is killed (or when Close closes the pipe). It then kills (SIGKILL) the processes
// whose pid files are in the cluster's dir ($1) and whose command lines name that dir: the
// Patroni processes and etcd first (their *.pid files), then the postmasters (postmaster.pid),
// which Patroni starts in sessions of their own that no parent-death signal reaches. Then it
// removes the dir. It runs as the user the servers run as, so it can touch nothing else.
const patroniJanitor = `dir=$1
cat >/dev/null
ours() {
	if [ -r "/proc/$1/cmdline" ]; then args=$(tr '\000' ' ' <"/proc/$1/cmdline")
	else args=$(ps -o args= -p "$1" 2>/dev/null); fi
	case $args in *"$dir"*) return 0;; esac
	return 1
}
for f in "$dir"/*.pid "$dir"/node*/data/postmaster.pid; do
	[ -f "$f" ] || continue
	read -r pid <"$f" || continue
	case $pid in ''|*[!0-9]*) continue;; esac
	ours "$pid" && kill -KILL "$pid" 2>/dev/null
done
sleep 1
rm -rf "$dir"
`

// patroniPrograms are the binaries a cluster needs beyond PostgreSQL's.
var patroniPrograms = []string{"patroni", "patronictl", "etcd"}

// findPatroniPrograms returns the paths of patroniPrograms: on PATH, else in /usr/bin.
func findPatroniPrograms() ([]string, error) {
	paths := make([]string, len(patroniPrograms))
	var missing []string
	for i, name := range patroniPrograms {
		if p, err := exec.LookPath(name); err == nil {
			paths[i] = p
		} else if p := filepath.Join("/usr/bin", name); pgserver.IsExecutable(p) {
			paths[i] = p
		} else {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("pgtest: patroni: %s not found on PATH nor in /usr/bin: install them (Debian, Ubuntu: apt-get install patroni etcd-server)", strings.Join(missing, ", "))
	}
	return paths, nil
}

func startPatroni(ctx context.Context, nodes int, settings []setting) (*PatroniCluster, error) {
	b, err := pgserver.FindBinaries()
	if err != nil {
		return nil, err
	}
	progs, err := findPatroniPrograms()
	if err != nil {
		return nil, err
	}
	cred, err := pgserver.RunAsCredential()
	if err != nil {
		return nil, err
	}
	ports, err := pgserver.FreePorts(2 + 2*nodes) // etcd client and peer; per node PostgreSQL and REST
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-patroni-*")
	if err != nil {
		return nil, fmt.Errorf("pgtest: patroni: %w", err)
	}
	c := &PatroniCluster{
		dir:   dir,
		http:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second},
		procs: patroniProcs{cred: cred, patroni: progs[0], ctl: progs[1]},
	}
	pgPorts := make([]int, nodes)
	for i := range nodes {
		pgPorts[i] = ports[2+2*i]
		c.nodes = append(c.nodes, &patroniNode{
			name:    "node" + strconv.Itoa(i),
			pgPort:  pgPorts[i],
			apiPort: ports[3+2*i],
			dir:     filepath.Join(dir, "node"+strconv.Itoa(i)),
		})
	}
	c.base = multiHostURL(pgPorts)
	fail := func(err error) (*PatroniCluster, error) {
		return nil, errors.Join(err, c.close())
	}
	if err := pgserver.ChownTo(dir, cred); err != nil {
		return fail(fmt.Errorf("pgtest: patroni: %w", err))
	}
	if err := c.startJanitor(); err != nil {
		return fail(err)
	}
	etcdHost := "127.0.0.1:" + strconv.Itoa(ports[0])
	if err := c.startEtcd(ctx, progs[2], etcdHost, "127.0.0.1:"+strconv.Itoa(ports[1])); err != nil {
		return fail(err)
	}
	ctl, err := json.Marshal(map[string]any{"scope": patroniScope, "namespace": "/pgtest/", "etcd3": map[string]any{"hosts": []string{etcdHost}}})
	if err != nil {
		return fail(fmt.Errorf("pgtest: patroni: %w", err))
	}
	if err := writePatroniFile(filepath.Join(dir, "patronictl.json"), string(ctl), cred); err != nil {
		return fail(err)
	}
	for _, n := range c.nodes {
		if err := c.writeNodeConfig(n, b.Dir, etcdHost, settings); err != nil {
			return fail(err)
		}
	}
	for _, n := range c.nodes {
		if err := c.startNode(n); err != nil {
			return fail(err)
		}
	}
	err = poll(ctx, "patroni: bootstrap", func() (bool, error) {
		if len(c.running()) < nodes {
			return false, fmt.Errorf("a member %w", pgserver.ErrExited)
		}
		leader, _, err := c.tryLeader(ctx, nil)
		if err == nil {
			err = c.tryStreaming(ctx, leader)
		}
		return err == nil, err
	})
	if err != nil {
		return fail(fmt.Errorf("%w\n%s", err, c.logs()))
	}
	return c, nil
}

// startJanitor starts the janitor (see patroniJanitor) on the cluster's dir.
func (c *PatroniCluster) startJanitor() error {
	cmd := pgserver.Command(context.Background(), c.procs.cred, c.dir, "/bin/sh", "-c", patroniJanitor, "janitor", c.dir)
	// Its own process group (no ^C), and no parent-death signal: it must outlive this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.procs.cred, Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("pgtest: patroni: janitor: %w", err)
	}
	r, err := pgserver.StartRun(cmd)
	if err != nil {
		in.Close()
		return err
	}
	c.procs.janitor, c.procs.janitorIn = r, in
	return nil
}

// spawn starts bin with args as the servers' user in the cluster's dir, its output appended
// to logPath and its pid written to <dir>/<name>.pid for the janitor, and returns its run.
// env adds to the environment.
func (c *PatroniCluster) spawn(bin, name, logPath string, env []string, args ...string) (*pgserver.Run, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtest: patroni: %s log: %w", name, err)
	}
	defer logf.Close()
	if err := pgserver.ChownTo(logPath, c.procs.cred); err != nil {
		return nil, fmt.Errorf("pgtest: patroni: %s log: %w", name, err)
	}
	// The process outlives any ctx of the caller; Close or the janitor ends it.
	cmd := pgserver.Command(context.Background(), c.procs.cred, c.dir, bin, args...)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	r, err := pgserver.StartRun(cmd)
	if err != nil {
		return nil, err
	}
	if err := writePatroniFile(filepath.Join(c.dir, name+".pid"), strconv.Itoa(r.Cmd.Process.Pid)+"\n", c.procs.cred); err != nil {
		return nil, errors.Join(err, r.Kill())
	}
	return r, nil
}

// patronictl runs patronictl with the cluster's DCS settings and args, and returns its
// output. Errors: its exit status with its output.
func (c *PatroniCluster) patronictl(ctx context.Context, args ...string) (string, error) {
	args = append([]string{"-c", filepath.Join(c.dir, "patronictl.json")}, args...)
	cmd := pgserver.Command(ctx, c.procs.cred, c.dir, c.procs.ctl, args...)
	cmd.Env = append(cmd.Env, "HOME="+c.dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pgtest: patroni: patronictl %s: %w\n%s", strings.Join(args[2:], " "), err, bytes.TrimSpace(out))
	}
	return string(bytes.TrimSpace(out)), nil
}

// nodeLog returns the tail of n's Patroni log (PostgreSQL's log goes there too).
func (c *PatroniCluster) nodeLog(n *patroniNode) string {
	return n.name + " log:\n" + pgserver.LogTail(filepath.Join(n.dir, "patroni.log"), 0)
}

// logs returns the tails of etcd's and every member's log.
func (c *PatroniCluster) logs() string {
	parts := []string{"etcd log:\n" + pgserver.LogTail(filepath.Join(c.dir, "etcd.log"), 0)}
	for _, n := range c.nodes {
		parts = append(parts, c.nodeLog(n))
	}
	return strings.Join(parts, "\n")
}

func (c *PatroniCluster) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	// Patroni first, so that none restarts a postmaster or takes over.
	for _, n := range c.nodes {
		if n.proc != nil {
			errs = append(errs, n.proc.Kill())
		}
	}
	for _, n := range c.nodes {
		n.proc = nil
		errs = append(errs, killPostmaster(filepath.Join(n.dir, "data")))
	}
	if c.procs.etcd != nil {
		errs = append(errs, c.procs.etcd.Kill())
	}
	if c.procs.janitor != nil {
		errs = append(errs, c.procs.janitor.Kill())
		c.procs.janitorIn.Close()
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: remove patroni dir: %w", err))
	}
	return errors.Join(errs...)
}
