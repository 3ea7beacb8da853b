package pgtest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/pgserver"
)

const (
	// patroniStartTimeout bounds [StartPatroni] after the binaries are found: etcd, the
	// leader's initdb and the replicas' base backups.
	patroniStartTimeout = 2 * time.Minute
	// leaderChangeTimeout bounds the wait for a new leader in [PatroniCluster.Switchover] and
	// [PatroniCluster.KillLeader], and for a restarted node in [PatroniCluster.RestartNode].
	leaderChangeTimeout = time.Minute
	// patroniMaxNodes is the largest cluster StartPatroni makes.
	patroniMaxNodes = 5
	// patroniScope is the Patroni cluster name (scope); each cluster has its own etcd.
	patroniScope = "pgtest"
)

// Patroni timings, in seconds, set in bootstrap.dcs. Patroni 3.0.2 (Debian 12) takes them as
// they are; newer releases raise values below their floors (ttl 20, loop_wait 1,
// retry_timeout 3) with a warning in their log (config.py, _validate_and_adjust_timeouts),
// which makes a failover take about 20 s instead of 8 but still works.
const (
	// patroniTTL is the leader key's lease: a killed leader's key expires after it, and a
	// replica takes over at its next loop. It respects Patroni's rule
	// loop_wait + 2*retry_timeout <= ttl.
	patroniTTL = 8
	// patroniLoopWait is the pause between two runs of Patroni's HA loop.
	patroniLoopWait = 1
	// patroniRetryTimeout bounds Patroni's retries of etcd and PostgreSQL operations before
	// a leader demotes itself: 3 s, so that a loaded test machine (etcd fsyncs every write)
	// does not demote a healthy leader.
	patroniRetryTimeout = 3
)

// PatroniCluster is a high-availability PostgreSQL cluster run by Patroni with a one-member
// etcd as its distributed configuration store, all on 127.0.0.1: the cluster users of
// fencelock run in production, for tests of switchover and automatic failover. Start one
// with [StartPatroni] or [NewPatroni]. Nodes are named node0, node1, ...; the leader is the
// primary, the others are streaming replicas. Its methods are safe for concurrent use.
//
// Clients connect as user postgres with trust authentication and without TLS.
// [PatroniCluster.URL] lists every node with target_session_attrs=read-write, so that a pool
// made from it follows the leader: connections to an old leader break, new ones go to the
// node that accepts writes.
type PatroniCluster struct {
	dir   string         // temp dir: etcd/, node<i>/, patronictl.json, *.pid
	nodes []*patroniNode // in name order; fixed after start
	base  *url.URL       // multi-host URL of the postgres database; see URL
	http  *http.Client   // for Patroni's REST API; no keep-alive, so no idle goroutines
	procs patroniProcs   // etcd, the janitor, binaries (platform-specific)

	mu     sync.Mutex // guards the nodes' runs and closed; held while a node starts or dies
	closed bool

	createMu sync.Mutex // serialises CreateDatabase

	closeOnce sync.Once
	closeErr  error
}

// patroniNode is one Patroni member and the PostgreSQL server it runs.
type patroniNode struct {
	name    string
	pgPort  int
	apiPort int
	dir     string        // node<i>/: data/, patroni.json, patroni.log, pgpass
	proc    *pgserver.Run // the Patroni process; nil once killed
}

// LeaderChange describes a change of leader made by [PatroniCluster.Switchover] or
// [PatroniCluster.KillLeader].
type LeaderChange struct {
	// From and To are the names of the old and the new leader.
	From, To string
	// Timeline is the new leader's PostgreSQL timeline (as in its WAL file names) once it
	// accepted writes; each promotion raises it by at least one.
	Timeline int
	// Elapsed is the time from the start of the switchover (or from the kill) until To
	// answered as a primary (pg_is_in_recovery() false), measured with 50 ms polling.
	Elapsed time.Duration
}

// StartPatroni starts an etcd server and nodes Patroni members (1 to 5) on 127.0.0.1, and
// returns once one member is the leader and accepts writes and every other one streams from
// it. The members bootstrap the cluster themselves: the first to take etcd's initialize key
// runs initdb, the others clone it with pg_basebackup. PostgreSQL is the one of [Start]'s
// local binaries (PG_BIN, PATH, /usr/lib/postgresql/<version>/bin); patroni, patronictl and
// etcd are looked up on PATH, else in /usr/bin (Debian: apt-get install patroni etcd-server).
// As root, every process runs as user postgres (or nobody), like local servers.
//
// The caller must [PatroniCluster.Close] the cluster. If the test binary dies first, the
// kernel kills etcd and the Patroni processes (Linux), and a janitor process, which notices
// the test binary's end when its stdin pipe closes, kills the postmasters (which Patroni
// starts in sessions of their own, out of reach of the parent-death signal) and removes the
// temp dir. ctx bounds the start, which also stops after two minutes.
//
// Defaults: DCS etcd v3 API (Patroni's etcd3 section; no --enable-v2); ttl 8 s, loop_wait
// 1 s, retry_timeout 3 s, so that a killed leader is replaced in about 8 s (Patroni releases
// newer than 3.0.2 raise ttl to their floor of 20 s and log a warning); use_pg_rewind and replication slots on; watchdog off; initdb
// with UTF8, locale C, --no-sync; pg_basebackup with --checkpoint=fast; trust authentication for 127.0.0.1 (replication included);
// PostgreSQL settings fsync=off, full_page_writes=on (pg_rewind needs it), wal_log_hints=on,
// max_connections=300, shared_buffers=64MB, then [WithSetting] values ([Crashable] changes
// nothing: every node runs from local binaries).
//
// Errors: an invalid nodes count or options, before anything starts; one saying to
// `apt-get install patroni etcd-server` when a binary is missing; the start error with the
// tails of etcd's and each member's log.
func StartPatroni(ctx context.Context, nodes int, opts ...Option) (*PatroniCluster, error) {
	if nodes < 1 || nodes > patroniMaxNodes {
		return nil, fmt.Errorf("pgtest: patroni: %d nodes: want 1 to %d", nodes, patroniMaxNodes)
	}
	c, err := parseOptions(opts)
	if err != nil {
		return nil, err
	}
	settings := append(slices.Clone(defaultSettings), setting{Name: "full_page_writes", Value: "on"}, setting{Name: "wal_log_hints", Value: "on"})
	settings = append(settings, c.settings...)
	ctx, cancel := context.WithTimeout(ctx, patroniStartTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		pc, err := startPatroni(ctx, nodes, settings)
		if err == nil || attempt == 3 || !portTaken(err) {
			return pc, err
		}
	}
}

// portTaken reports whether a cluster's start failed because a port chosen free was taken
// before its program bound it (another process's ephemeral port, say): the start is then
// worth another try on other ports. Seen in CI: a member's REST API "Couldn't start a service".
func portTaken(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Couldn't start a service") || strings.Contains(msg, "address already in use") || pgserver.IsBindError(msg)
}

// NewPatroni starts a Patroni cluster of nodes members with [StartPatroni] and closes it at
// test cleanup.
//
// With go test -short it calls t.Skip("needs PostgreSQL"). Missing patroni or etcd binaries
// skip the test with a message saying to `apt-get install patroni etcd-server`, or, under CI
// ([InCI]), fail it; any other start error fails it with t.Fatal.
func NewPatroni(t testing.TB, nodes int, opts ...Option) *PatroniCluster {
	t.Helper()
	if testing.Short() {
		t.Skip(skipReason)
	}
	NeedPatroni(t)
	return startOrSkip(t, serverStartTimeout, func(ctx context.Context) (*PatroniCluster, error) {
		return StartPatroni(ctx, nodes, opts...)
	}, (*PatroniCluster).Close)
}

// multiHostURL returns the URL of the postgres database on every port of 127.0.0.1, in
// order, with target_session_attrs=read-write and connect_timeout=5.
func multiHostURL(ports []int) *url.URL {
	hosts := make([]string, len(ports))
	for i, p := range ports {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	base := pgserver.LoopbackURL("127.0.0.1", ports[0], url.User("postgres"))
	base.Host = strings.Join(hosts, ",")
	q := base.Query()
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "5")
	base.RawQuery = q.Encode()
	return base
}

// URL returns a multi-host postgres:// URL of database on the cluster, as user postgres:
// every node's 127.0.0.1:port in name order, with sslmode=disable,
// target_session_attrs=read-write (a client keeps the first host that accepts writes: the
// leader) and connect_timeout=5 (seconds, per host). pgx and libpq both understand it. It
// does not check that the database exists.
//
// pgx (like libpq) stops at the first host that answers "database does not exist"
// (SQLSTATE 3D000) instead of trying the next: a database created on the leader is usable
// through this URL only once every replica listed before the leader has replayed its
// creation, which [PatroniCluster.CreateDatabase] waits for.
func (c *PatroniCluster) URL(database string) string {
	u := *c.base
	u.Path = "/" + database
	u.RawPath = ""
	return u.String()
}

// Nodes returns the names of the cluster's members, node0 to node<n-1>, killed ones included.
func (c *PatroniCluster) Nodes() []string {
	names := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		names[i] = n.name
	}
	return names
}

// NodeURL returns the postgres:// URL of database on the member named node alone (whatever
// its role), as user postgres with sslmode=disable. Errors: an unknown node name.
func (c *PatroniCluster) NodeURL(node, database string) (string, error) {
	n, err := c.node(node)
	if err != nil {
		return "", err
	}
	return n.url(database), nil
}

func (n *patroniNode) url(database string) string {
	u := pgserver.LoopbackURL("127.0.0.1", n.pgPort, url.User("postgres"))
	u.Path = "/" + database
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

func (c *PatroniCluster) node(name string) (*patroniNode, error) {
	for _, n := range c.nodes {
		if n.name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("pgtest: patroni: no node %q (have %s)", name, strings.Join(c.Nodes(), ", "))
}

// running returns the nodes whose Patroni process runs.
func (c *PatroniCluster) running() []*patroniNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	var nodes []*patroniNode
	for _, n := range c.nodes {
		if n.proc != nil && !n.proc.HasExited() {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// Close kills every Patroni process, then every postmaster and etcd (SIGKILL: nothing in a
// test cluster is worth a clean shutdown, and a Patroni stopped gracefully would hand its
// lock over), waits until they have exited (at most 10 s for each postmaster, which is not
// its child) and removes the cluster's temp dir. Pools on the cluster break. Close is
// idempotent: later calls return the first call's result.
func (c *PatroniCluster) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}
