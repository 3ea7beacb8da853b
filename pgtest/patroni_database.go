package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/pgserver"
)

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
