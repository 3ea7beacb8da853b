package fencelock

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Server sessions a grant may have been left on: a statement the client abandoned mid-flight
// may still run, and commit, on its backend. These helpers end such a statement and wait for
// its backend to exit, so that a call that gave up returns only once nothing is left held.

// backendAliveSQL and cancelGrantSQL are plain SQL, not sqlc's: sqlc's catalog has no
// pg_stat_activity. cancelGrantSQL cancels the backend only while it runs a grant statement
// (sqlc's text starts with its name) in this database: behind a pooler the pid a connection
// reported is not its backend's, and another session's statement must never be cancelled.
const (
	backendAliveSQL = `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND datname = current_database())`
	cancelGrantSQL  = `SELECT count(pg_cancel_backend(a.pid)) FROM pg_stat_activity AS a
		WHERE a.pid = $1 AND a.datname = current_database() AND a.query LIKE '-- name: LeaseGrant %'`
)

// endAbandonedGrant cancels the grant statement that the backend with pid may still run for
// a connection the client abandoned, and then waits until that backend has exited, for at
// most cleanupTimeout, detached from ctx. When no backend with pid runs a grant in this
// database (it has exited, or pid is a pooler's), there is nothing to cancel or await.
func (l *Lessor) endAbandonedGrant(ctx context.Context, pid uint32) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var cancelled int64
	if err := l.pool.QueryRow(cctx, cancelGrantSQL, int32(pid)).Scan(&cancelled); err != nil {
		return fmt.Errorf("cancel abandoned grant on backend %d: %w", pid, err)
	}
	if cancelled == 0 {
		return nil
	}
	return awaitBackendExit(cctx, l.pool, pid)
}

// awaitBackendExit polls pool, every 2ms, until no backend with pid is left in this database,
// or ctx ends. There is no event to wait on: Postgres does not notify a backend's exit.
func awaitBackendExit(ctx context.Context, pool *pgxpool.Pool, pid uint32) error {
	for {
		var alive bool
		if err := pool.QueryRow(ctx, backendAliveSQL, int32(pid)).Scan(&alive); err != nil {
			return fmt.Errorf("await exit of backend %d: %w", pid, err)
		}
		if !alive {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("await exit of backend %d: %w", pid, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}
