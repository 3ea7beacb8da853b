package pgtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// patroniMember is one entry of GET /cluster of Patroni's REST API.
type patroniMember struct {
	Name  string `json:"name"`
	Role  string `json:"role"` // "leader", "replica", "sync_standby", ...
	State string `json:"state"`
}

// Leader returns the name of the member that holds the leader key in etcd, as the REST API
// (GET /cluster) of the first running member that answers reports it (when that member
// reports no leader, Leader says so without asking the others). Right after a leader
// dies its key lives on until its TTL (8 s) expires, so Leader may name a dead node then;
// [PatroniCluster.KillLeader] and [PatroniCluster.Switchover] wait for the new leader
// themselves. Safe for concurrent use.
//
// Errors: one if no member runs, none answers, or the cluster has no leader; ctx's error.
func (c *PatroniCluster) Leader(ctx context.Context) (string, error) {
	nodes := c.running()
	if len(nodes) == 0 {
		return "", fmt.Errorf("pgtest: patroni: leader: %w", errNoMember)
	}
	var errs []error
	for _, n := range nodes {
		var cluster struct {
			Members []patroniMember `json:"members"`
		}
		if err := c.getJSON(ctx, n, "/cluster", &cluster); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, m := range cluster.Members {
			if m.Role == "leader" {
				return m.Name, nil
			}
		}
		return "", fmt.Errorf("pgtest: patroni: leader: %s reports no leader (members %+v)", n.name, cluster.Members)
	}
	return "", fmt.Errorf("pgtest: patroni: leader: %w", errors.Join(errs...))
}

// getJSON decodes the answer of GET path on n's REST API into v.
func (c *PatroniCluster) getJSON(ctx context.Context, n *patroniNode, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(n.apiPort)+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s REST API: %w", n.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s REST API: GET %s: %s", n.name, path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s REST API: GET %s: %w", n.name, path, err)
	}
	return nil
}

// isPrimary reports whether n's PostgreSQL accepts connections and is out of recovery, and
// returns its timeline then.
func isPrimary(ctx context.Context, n *patroniNode) (bool, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.url("postgres"))
	if err != nil {
		return false, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var inRecovery bool
	var tl string
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(),
		CASE WHEN pg_is_in_recovery() THEN '' ELSE substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8) END`).Scan(&inRecovery, &tl)
	if err != nil || inRecovery {
		return false, 0, err
	}
	timeline, err := strconv.ParseInt(tl, 16, 32)
	if err != nil {
		return false, 0, fmt.Errorf("timeline of WAL file %q: %w", tl, err)
	}
	return true, int(timeline), nil
}

// errNoMember says no member of the cluster runs: waiting for a leader is hopeless.
var errNoMember = errors.New("no member is running")

// poll calls try every 50 ms until it reports done, until the reason it gives wraps
// errNoMember or pgserver.ErrExited (hopeless), or until ctx ends; it then returns an error wrapping
// that reason (and ctx's error), prefixed with "pgtest: " and what.
func poll(ctx context.Context, what string, try func() (done bool, reason error)) error {
	for {
		done, reason := try()
		if done {
			return nil
		}
		if errors.Is(reason, errNoMember) || errors.Is(reason, pgserver.ErrExited) {
			return fmt.Errorf("pgtest: %s: %w", what, reason)
		}
		timer := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("pgtest: %s: %w (last: %w)", what, ctx.Err(), reason)
		case <-timer.C:
		}
	}
}

// tryLeader returns the member the leader key names if it runs, accept (nil: any) lets it
// through and its PostgreSQL is a primary, with its timeline; otherwise an error saying why
// not.
func (c *PatroniCluster) tryLeader(ctx context.Context, accept func(string) bool) (*patroniNode, int, error) {
	name, err := c.Leader(ctx)
	if err != nil {
		return nil, 0, err
	}
	if accept != nil && !accept(name) {
		return nil, 0, fmt.Errorf("the leader is still %s", name)
	}
	n, err := c.node(name)
	if err != nil {
		return nil, 0, err
	}
	ok, tl, err := isPrimary(ctx, n)
	if err != nil || !ok {
		return nil, 0, fmt.Errorf("leader %s is not a primary yet: %w", name, err)
	}
	return n, tl, nil
}

// waitLeader polls tryLeader until it succeeds.
func (c *PatroniCluster) waitLeader(ctx context.Context, accept func(string) bool) (*patroniNode, int, error) {
	var leader *patroniNode
	var timeline int
	err := poll(ctx, "patroni: wait for a leader that accepts writes", func() (bool, error) {
		var err error
		leader, timeline, err = c.tryLeader(ctx, accept)
		return err == nil, err
	})
	return leader, timeline, err
}

// tryStreaming returns nil if every running member other than leader streams WAL from it
// (pg_stat_replication on leader, state streaming), else an error saying which does not.
func (c *PatroniCluster) tryStreaming(ctx context.Context, leader *patroniNode) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, leader.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Patroni sets each replica's application_name to its member name.
	var streaming []string
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(application_name::text ORDER BY application_name), '{}')
		FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&streaming)
	if err != nil {
		return err
	}
	for _, n := range c.running() {
		if n != leader && !slices.Contains(streaming, n.name) {
			return fmt.Errorf("%s streams to %q, not yet to %s", leader.name, streaming, n.name)
		}
	}
	return nil
}

// waitStreaming polls tryStreaming until it succeeds.
func (c *PatroniCluster) waitStreaming(ctx context.Context, leader *patroniNode) error {
	return poll(ctx, "patroni: wait for the replicas to stream from "+leader.name, func() (bool, error) {
		err := c.tryStreaming(ctx, leader)
		return err == nil, err
	})
}

// Switchover makes candidate the leader with `patronictl switchover --leader <leader>
// --candidate <candidate> --force` (any healthy replica Patroni picks when candidate is ""),
// waits until the new leader accepts writes, then until every other running member streams
// from it, and returns the change. Patroni stops the old leader's PostgreSQL (fast shutdown),
// promotes the candidate, which starts a new timeline, and restarts the old leader as its
// replica. It waits at most one minute, less if ctx ends first. Safe for concurrent use, but
// concurrent switchovers and failovers of one cluster race each other.
//
// Errors: an unknown or killed candidate, or the leader itself; patronictl's error with its
// output (if the deadline ends patronictl, its error is "signal: killed"); on a timeout
// while waiting for the new leader or its replicas, one wrapping [context.DeadlineExceeded].
func (c *PatroniCluster) Switchover(ctx context.Context, candidate string) (LeaderChange, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	old, _, err := c.waitLeader(ctx, nil)
	if err != nil {
		return LeaderChange{}, err
	}
	args := []string{"switchover", "--leader", old.name, "--force"}
	if candidate != "" {
		n, err := c.node(candidate)
		if err != nil {
			return LeaderChange{}, err
		}
		if n == old {
			return LeaderChange{}, fmt.Errorf("pgtest: patroni: switchover: %s is the leader already", candidate)
		}
		if !slices.Contains(c.running(), n) {
			return LeaderChange{}, fmt.Errorf("pgtest: patroni: switchover: %s is not running (RestartNode it first)", candidate)
		}
		args = append(args, "--candidate", candidate)
	}
	began := time.Now()
	out, err := c.patronictl(ctx, args...)
	if err != nil {
		return LeaderChange{}, err
	}
	leader, timeline, err := c.waitLeader(ctx, func(name string) bool {
		return name != old.name && (candidate == "" || name == candidate)
	})
	if err != nil {
		return LeaderChange{}, fmt.Errorf("%w\npatronictl: %s", err, out)
	}
	change := LeaderChange{From: old.name, To: leader.name, Timeline: timeline, Elapsed: time.Since(began)}
	if err := c.waitStreaming(ctx, leader); err != nil {
		return change, err
	}
	return change, nil
}

// KillLeader kills (SIGKILL) the leader's Patroni process and then its postmaster, the way a
// machine dies, and waits until Patroni's automatic failover has made another running member
// the leader and it accepts writes: the old leader's key expires after its TTL (8 s), then a
// replica takes it at its next HA loop and promotes itself (a new timeline). It then waits
// until the remaining members stream from the new leader and returns the change, Elapsed
// measured from the kill. The killed member stays down until [PatroniCluster.RestartNode]. It
// waits at most one minute, less if ctx ends first. Safe for concurrent use.
//
// Errors: one if no other member runs (nothing could take over); signal errors; on timeout,
// one wrapping [context.DeadlineExceeded].
func (c *PatroniCluster) KillLeader(ctx context.Context) (LeaderChange, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	old, _, err := c.waitLeader(ctx, nil)
	if err != nil {
		return LeaderChange{}, err
	}
	if len(c.running()) < 2 {
		return LeaderChange{}, fmt.Errorf("pgtest: patroni: kill leader: %s is the only running member; nothing could take over", old.name)
	}
	began := time.Now()
	if err := c.killNode(old); err != nil {
		return LeaderChange{}, err
	}
	leader, timeline, err := c.waitLeader(ctx, func(name string) bool { return name != old.name })
	if err != nil {
		return LeaderChange{}, err
	}
	change := LeaderChange{From: old.name, To: leader.name, Timeline: timeline, Elapsed: time.Since(began)}
	if err := c.waitStreaming(ctx, leader); err != nil {
		return change, err
	}
	return change, nil
}

// RestartNode starts the Patroni process of node, a member killed by
// [PatroniCluster.KillLeader], again, and returns once the member streams from the leader.
// Patroni recovers its PostgreSQL and rejoins it as a replica, rewinding it with pg_rewind if
// it had WAL the new leader lacks. It waits at most one minute, less if ctx ends first. Safe
// for concurrent use.
//
// Errors: an unknown node name; one if node is running; the start error; on timeout, one
// wrapping [context.DeadlineExceeded] with the tail of the member's log.
func (c *PatroniCluster) RestartNode(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	n, err := c.node(node)
	if err != nil {
		return err
	}
	if err := c.startNode(n); err != nil {
		return err
	}
	leader, _, err := c.waitLeader(ctx, nil)
	if err == nil {
		err = c.waitStreaming(ctx, leader)
	}
	if err == nil {
		// Streaming means received, not replayed: a database created while the node was down
		// would answer "does not exist" there, and pgx would stop at it (see URL).
		var conn *pgx.Conn
		if conn, err = pgx.Connect(ctx, leader.url("postgres")); err == nil {
			err = c.waitReplicas(ctx, leader, conn)
			conn.Close(context.WithoutCancel(ctx))
		}
	}
	if err != nil {
		return fmt.Errorf("pgtest: patroni: restart %s: %w\n%s", node, err, c.nodeLog(n))
	}
	return nil
}

// CreateDatabase creates a fresh database with fencelock's schema on the leader, waits until
// every running replica has replayed its creation (so that [PatroniCluster.URL] reaches it
// whichever host comes first), and returns its name and URL (the multi-host one). It creates
// the database as [Server.CreateDatabase] does, on the leader: the first call creates the
// template database fencelock_template and migrates it with
// [github.com/fencelock/fencelock.Migrate]; every call clones it with CREATE DATABASE ...
// TEMPLATE. Both survive switchovers and failovers. Names are t_<counter>_<random hex>. Safe
// for concurrent use; a leader change during the call makes it fail.
//
// Errors: connection and SQL errors, wrapped; on timeout (no leader for a minute, or a
// replica that does not catch up), one wrapping [context.DeadlineExceeded].
func (c *PatroniCluster) CreateDatabase(ctx context.Context) (name, dbURL string, err error) {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	leader, _, err := c.waitLeader(ctx, nil)
	if err != nil {
		return "", "", err
	}
	// The leader, seen as a server of its own (pgx stops at the first host that answers
	// "database does not exist", so the template is built through the leader alone).
	srv := &Server{kind: kindLocal, base: pgserver.LoopbackURL("127.0.0.1", leader.pgPort, url.User("postgres")), maintDB: "postgres", tplName: templateName}
	c.createMu.Lock() // one clone at a time: CREATE DATABASE ... TEMPLATE fails while another copies it
	defer c.createMu.Unlock()
	if name, _, err = srv.CreateDatabase(ctx); err != nil {
		return "", "", fmt.Errorf("pgtest: patroni: %w", err)
	}
	conn, err := pgx.Connect(ctx, leader.url("postgres"))
	if err != nil {
		return "", "", fmt.Errorf("pgtest: patroni: create database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := c.waitReplicas(ctx, leader, conn); err != nil {
		return "", "", fmt.Errorf("pgtest: patroni: create database %s: %w", name, err)
	}
	return name, c.URL(name), nil
}

// WaitReplay waits until every running replica has replayed all WAL the leader had written
// when WaitReplay was called, so that everything committed on the leader before the call is
// on every replica (a switchover or failover then loses none of it). It commits an empty
// transaction with synchronous_commit = on on the leader first, then polls each replica's
// pg_last_wal_replay_lsn(). It waits at most one minute, less if ctx ends first. Safe for
// concurrent use.
//
// Errors: one if no leader accepts writes within that time; connection and SQL errors; on
// timeout, one wrapping [context.DeadlineExceeded] (or ctx's error).
func (c *PatroniCluster) WaitReplay(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, leaderChangeTimeout)
	defer cancel()
	leader, _, err := c.waitLeader(ctx, nil)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, leader.url("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: patroni: wait replay: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := c.waitReplicas(ctx, leader, conn); err != nil {
		return fmt.Errorf("pgtest: patroni: wait replay: %w", err)
	}
	return nil
}

// waitReplicas waits until every running member other than leader has replayed the WAL
// leader (behind conn) has written so far.
func (c *PatroniCluster) waitReplicas(ctx context.Context, leader *patroniNode, conn *pgx.Conn) error {
	var target string
	_, err := conn.Exec(ctx, `SET synchronous_commit = on`)
	if err == nil {
		_, err = conn.Exec(ctx, `SELECT txid_current()`) // a commit record, flushed with all WAL before it
	}
	if err == nil {
		err = conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&target)
	}
	if err != nil {
		return err
	}
	for _, n := range c.running() {
		if n == leader {
			continue
		}
		// A replica Patroni is (re)starting refuses connections for a moment: retry.
		var rc *pgx.Conn
		err := poll(ctx, "patroni: replica "+n.name+" accepts connections", func() (bool, error) {
			var err error
			rc, err = pgx.Connect(ctx, n.url("postgres"))
			return err == nil, err
		})
		if err != nil {
			return err
		}
		err = pollReplay(ctx, rc, target)
		rc.Close(context.WithoutCancel(ctx))
		if err != nil {
			return fmt.Errorf("replica %s: %w", n.name, err)
		}
	}
	return nil
}

// NewDB returns a fresh database on the cluster, made by [PatroniCluster.CreateDatabase], with
// a pgxpool (default settings) on its multi-host URL, which follows the leader. At test
// cleanup it closes the pool and drops the database (WITH (FORCE), on whichever member leads
// then), unless the cluster is closed by then. The DB's Server is nil: the database lives on
// a cluster, not on one server. Safe to call from parallel tests.
//
// With go test -short it calls t.Skip("needs PostgreSQL"); otherwise an error fails the test
// with t.Fatal.
func (c *PatroniCluster) NewDB(t testing.TB) *DB {
	t.Helper()
	return newDB(t, nil, c.CreateDatabase, c.isClosed, c.dropDatabase)
}

func (c *PatroniCluster) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// dropDatabase drops database name on the leader, terminating its sessions.
func (c *PatroniCluster) dropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: patroni: drop database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgserver.QuoteIdent(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: patroni: drop database %s: %w", name, err)
	}
	return nil
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
