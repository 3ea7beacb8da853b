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

// startEtcd starts a one-member etcd serving clients on client and peers on peer (host:port)
// and waits until its /health says true.
func (c *PatroniCluster) startEtcd(ctx context.Context, bin, client, peer string) error {
	logPath := filepath.Join(c.dir, "etcd.log")
	r, err := c.spawn(bin, "etcd", logPath, nil,
		"--name", "pgtest",
		"--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", "http://"+client,
		"--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer,
		"--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "pgtest=http://"+peer,
		"--logger", "zap", "--log-level", "warn")
	if err != nil {
		return err
	}
	c.procs.etcd = r
	err = poll(ctx, "patroni: wait for etcd", func() (bool, error) {
		if r.HasExited() {
			return false, fmt.Errorf("etcd %w", pgserver.ErrExited)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+client+"/health", nil)
		if err != nil {
			return false, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"true"`)), fmt.Errorf("etcd /health: %s %s", resp.Status, body)
	})
	if err != nil {
		return fmt.Errorf("%w\netcd log:\n%s", err, pgserver.LogTail(logPath, 0))
	}
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

// writeNodeConfig writes n's patroni.json (JSON is YAML, which Patroni reads).
func (c *PatroniCluster) writeNodeConfig(n *patroniNode, binDir, etcdHost string, settings []setting) error {
	if err := os.Mkdir(n.dir, 0o700); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	if err := pgserver.ChownTo(n.dir, c.procs.cred); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	params := map[string]string{}
	for _, s := range settings {
		params[s.Name] = s.Value
	}
	hba := []string{
		"local all all trust",
		"host all all 127.0.0.1/32 trust",
		"host replication all 127.0.0.1/32 trust",
	}
	user := map[string]string{"username": "postgres"}
	pgAddr := "127.0.0.1:" + strconv.Itoa(n.pgPort)
	apiAddr := "127.0.0.1:" + strconv.Itoa(n.apiPort)
	cfg := map[string]any{
		"scope":     patroniScope,
		"namespace": "/pgtest/",
		"name":      n.name,
		"restapi":   map[string]any{"listen": apiAddr, "connect_address": apiAddr},
		"etcd3":     map[string]any{"hosts": []string{etcdHost}},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl":                     patroniTTL,
				"loop_wait":               patroniLoopWait,
				"retry_timeout":           patroniRetryTimeout,
				"maximum_lag_on_failover": 1 << 20,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters":    params,
				},
			},
			"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen":          pgAddr,
			"connect_address": pgAddr,
			"data_dir":        filepath.Join(n.dir, "data"),
			"bin_dir":         binDir,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			"authentication":  map[string]any{"superuser": user, "replication": user, "rewind": user},
			"parameters":      map[string]string{"unix_socket_directories": n.dir},
			"pg_hba":          hba,
			"basebackup":      []any{map[string]string{"checkpoint": "fast"}},
		},
		"watchdog": map[string]any{"mode": "off"},
	}
	text, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	return writePatroniFile(filepath.Join(n.dir, "patroni.json"), string(text), c.procs.cred)
}

// writePatroniFile writes text to a new file at path, readable only by its owner, cred's user.
func writePatroniFile(path, text string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	if err := pgserver.ChownTo(path, cred); err != nil {
		return fmt.Errorf("pgtest: patroni: %w", err)
	}
	return nil
}

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
