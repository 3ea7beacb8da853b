package pgtest_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/pgtest"
)

// insertLease writes a lease row named name through pool, retrying for a few seconds while the
// pool's connections to a demoted or dead leader break and it dials the new one.
func insertLease(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	ctx := testContext(t)
	var err error
	for range 100 {
		_, err = pool.Exec(ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
			VALUES ($1, 'patroni', now(), now() + interval '1 minute')`, name)
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err, "insert %s", name)
}

// serverPort returns the port of the server behind pool.
func serverPort(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var port int
	require.NoError(t, pool.QueryRow(testContext(t), `SELECT inet_server_port()`).Scan(&port))
	return port
}

// nodePort returns the PostgreSQL port of node.
func nodePort(t *testing.T, c *pgtest.PatroniCluster, node string) int {
	t.Helper()
	url, err := c.NodeURL(node, "postgres")
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	return int(cfg.Port)
}

// requireReplica checks that node is a hot standby.
func requireReplica(t *testing.T, c *pgtest.PatroniCluster, node string) {
	t.Helper()
	url, err := c.NodeURL(node, "postgres")
	require.NoError(t, err)
	var inRecovery bool
	require.NoError(t, pgxConnectScan(t, url, `SELECT pg_is_in_recovery()`, &inRecovery))
	require.True(t, inRecovery, "%s is a replica", node)
}

// waitReplayed waits until node, a replica, shows the lease name in database.
func waitReplayed(t *testing.T, c *pgtest.PatroniCluster, node, database, name string) {
	t.Helper()
	url, err := c.NodeURL(node, database)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		err := pgxConnectScan(t, url, `SELECT count(*) FROM fencelock.leases WHERE name = '`+name+`'`, &n)
		return err == nil && n == 1
	}, 30*time.Second, 20*time.Millisecond, "%s replays lease %s", node, name)
}

// TestPatroni runs one two-member cluster through a switchover, an automatic failover and the
// old leader's return, checking that each promotion raises the timeline, that nothing
// committed and replicated is lost, and that a pool on the multi-host URL follows the leader.
func TestPatroni(t *testing.T) {
	t.Parallel()
	testBegan := time.Now()
	// A bound for hangs, not for speed: the cluster's start, two switchovers, a failover and a
	// rewind took 2 minutes in all beside a second suite under four busy loops (the start alone
	// 51 s), and testContext's 2 minutes ended the last switchover's patronictl.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)

	began := time.Now()
	c := pgtest.NewPatroni(t, 2)
	t.Logf("NewPatroni(2): %v (leader accepts writes, replica streams)", time.Since(began))
	require.Equal(t, []string{"node0", "node1"}, c.Nodes())
	require.Equal(t, "postgres://postgres@127.0.0.1:"+fmt.Sprint(nodePort(t, c, "node0"))+",127.0.0.1:"+fmt.Sprint(nodePort(t, c, "node1"))+
		"/db?connect_timeout=5&sslmode=disable&target_session_attrs=read-write", c.URL("db"))
	_, err := c.NodeURL("node9", "postgres")
	require.ErrorContains(t, err, `no node "node9"`)

	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	replica := map[string]string{"node0": "node1", "node1": "node0"}[leader]
	requireReplica(t, c, replica)

	db := c.NewDB(t)
	var timeline int
	t.Run("WriteOnLeader", func(t *testing.T) {
		insertLease(t, db.Pool, "first")
		require.Equal(t, nodePort(t, c, leader), serverPort(t, db.Pool), "the pool is on the leader")
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int`).Scan(&timeline))
		waitReplayed(t, c, replica, db.Name, "first")
	})

	t.Run("Switchover", func(t *testing.T) {
		change, err := c.Switchover(ctx, replica)
		require.NoError(t, err)
		t.Logf("Switchover %s -> %s: new leader accepts writes after %v, timeline %d -> %d", change.From, change.To, change.Elapsed, timeline, change.Timeline)
		require.Equal(t, pgtest.LeaderChange{From: leader, To: replica, Timeline: change.Timeline, Elapsed: change.Elapsed}, change)
		require.Greater(t, change.Timeline, timeline, "the promotion starts a new timeline")
		now, err := c.Leader(ctx)
		require.NoError(t, err)
		require.Equal(t, replica, now)
		requireReplica(t, c, leader) // the old leader follows

		insertLease(t, db.Pool, "after-switchover")
		require.Equal(t, nodePort(t, c, replica), serverPort(t, db.Pool), "the multi-host pool reaches the new leader")
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.leases WHERE name IN ('first', 'after-switchover')`).Scan(&n))
		require.Equal(t, 2, n)
		leader, replica, timeline = replica, leader, change.Timeline
		waitReplayed(t, c, replica, db.Name, "after-switchover")

		_, err = c.Switchover(ctx, leader)
		require.ErrorContains(t, err, "is the leader already")
	})

	t.Run("FailoverAfterKill", func(t *testing.T) {
		change, err := c.KillLeader(ctx)
		require.NoError(t, err)
		t.Logf("KillLeader %s: %s accepts writes after %v, timeline %d -> %d", change.From, change.To, change.Elapsed, timeline, change.Timeline)
		require.Equal(t, leader, change.From)
		require.Equal(t, replica, change.To)
		require.Greater(t, change.Timeline, timeline)
		_, err = pgxConnectScan2(t, mustNodeURL(t, c, change.From))
		require.Error(t, err, "the killed leader is down")

		insertLease(t, db.Pool, "after-failover")
		require.Equal(t, nodePort(t, c, change.To), serverPort(t, db.Pool), "the multi-host pool reaches the promoted replica")
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.leases`).Scan(&n))
		require.Equal(t, 3, n, "every replicated commit survives")

		_, err = c.KillLeader(ctx)
		require.ErrorContains(t, err, "only running member")

		began := time.Now()
		require.NoError(t, c.RestartNode(ctx, change.From))
		t.Logf("RestartNode %s: streams from %s after %v", change.From, change.To, time.Since(began))
		requireReplica(t, c, change.From)
		require.ErrorContains(t, c.RestartNode(ctx, change.From), "is running")
		waitReplayed(t, c, change.From, db.Name, "after-failover")
		leader, replica, timeline = change.To, change.From, change.Timeline
	})

	t.Run("SwitchoverBack", func(t *testing.T) {
		change, err := c.Switchover(ctx, "") // Patroni picks the candidate
		require.NoError(t, err)
		t.Logf("Switchover %s -> %s: %v, timeline %d -> %d", change.From, change.To, change.Elapsed, timeline, change.Timeline)
		require.Equal(t, replica, change.To)
		require.Greater(t, change.Timeline, timeline)
		insertLease(t, db.Pool, "after-second-switchover")
	})
	t.Logf("TestPatroni: %v in all", time.Since(testBegan))
}

// mustNodeURL returns node's URL of database postgres.
func mustNodeURL(t *testing.T, c *pgtest.PatroniCluster, node string) string {
	t.Helper()
	url, err := c.NodeURL(node, "postgres")
	require.NoError(t, err)
	return url
}

// pgxConnectScan2 tries to connect to url within two seconds and runs SELECT 1.
func pgxConnectScan2(t *testing.T, url string) (int, error) {
	ctx, cancel := context.WithTimeout(testContext(t), 2*time.Second)
	defer cancel()
	var one int
	err := connectScan(ctx, url, `SELECT 1`, &one)
	return one, err
}

// needPatroni skips t in -short mode, runs it in parallel, and skips it without Patroni's
// programs (pgtest.NeedPatroni).
func needPatroni(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	t.Parallel()
	pgtest.NeedPatroni(t)
}

func TestStartPatroni_Errors(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	for _, n := range []int{0, -1, 6} {
		_, err := pgtest.StartPatroni(ctx, n)
		require.ErrorContains(t, err, "want 1 to 5", "nodes %d", n)
	}
	_, err := pgtest.StartPatroni(ctx, 1, pgtest.WithSetting("port", "1"))
	require.ErrorContains(t, err, "managed by pgtest")
	_, err = pgtest.StartPatroni(ctx, 1, nil)
	require.ErrorContains(t, err, "nil Option")
}

// TestStartPatroni_Close runs a one-member cluster's whole life without testing.T helpers, with
// a setting, and checks that Close leaves no server behind.
func TestStartPatroni_Close(t *testing.T) {
	needPatroni(t)
	ctx := testContext(t)
	began := time.Now()
	c, err := pgtest.StartPatroni(ctx, 1, pgtest.WithSetting("application_name", "pgtest_patroni"))
	require.NoError(t, err)
	t.Logf("StartPatroni(1): %v", time.Since(began))
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "node0", leader)
	var app string
	require.NoError(t, pgxConnectScan(t, c.URL("postgres"), `SELECT current_setting('application_name')`, &app))
	require.Equal(t, "pgtest_patroni", app)
	name, url, err := c.CreateDatabase(ctx)
	require.NoError(t, err)
	require.Equal(t, c.URL(name), url)
	var migrated bool
	require.NoError(t, pgxConnectScan(t, url, `SELECT to_regclass('fencelock.leases') IS NOT NULL`, &migrated))
	require.True(t, migrated)
	_, err = c.KillLeader(ctx)
	require.ErrorContains(t, err, "only running member")

	began = time.Now()
	require.NoError(t, c.Close())
	t.Logf("Close: %v", time.Since(began))
	require.NoError(t, c.Close(), "Close is idempotent")
	_, err = pgxConnectScan2(t, c.URL("postgres"))
	require.Error(t, err, "the cluster is gone")
	_, err = c.Leader(ctx)
	require.ErrorContains(t, err, "no member is running")
}

// TestPatroniDiesWithTestBinary checks that a cluster whose test binary is killed (SIGKILL, so
// no cleanup runs) goes away: no postmaster listens any more and the temp dir is removed,
// both by the janitor. (etcd and Patroni get the parent-death signal; this test does not
// check their ports.)
func TestPatroniDiesWithTestBinary(t *testing.T) {
	needPatroni(t)
	cmd, tmp, url := startHangingChild(t, "patroni")
	hosts, _, _ := strings.Cut(strings.TrimPrefix(url, "postgres://postgres@"), "/")
	addrs := strings.Split(hosts, ",")
	require.Len(t, addrs, 2, url)
	var one int
	require.NoError(t, pgxConnectScan(t, url, `SELECT 1`, &one), "the child's cluster is up")
	dirs, err := filepath.Glob(filepath.Join(tmp, "pgtest-patroni-*"))
	require.NoError(t, err)
	require.Len(t, dirs, 1)

	began := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.Eventually(t, func() bool {
		for _, addr := range addrs {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				conn.Close()
				return false
			}
		}
		_, err := os.Stat(dirs[0])
		return os.IsNotExist(err)
	}, 30*time.Second, 50*time.Millisecond, "no postmaster listens and the temp dir is gone")
	t.Logf("cluster gone %v after the test binary's death", time.Since(began))
}
