package fencelock

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// Server sessions a grant may have been left on: a statement the client abandoned mid-flight
// may still run, and commit, on its backend. These helpers end such a statement and wait for
// its backend to exit, so that a call that gave up returns only once nothing is left held.

// cleanupTimeout bounds the statement that ends a grant whose outcome the client could not
// learn (its acquire was cancelled mid-flight). Past it the grant expires by its TTL.
const cleanupTimeout = 5 * time.Second

// backendAliveSQL and cancelGrantSQL are plain SQL, not sqlc's: sqlc's catalog has no
// pg_stat_activity. cancelGrantSQL cancels the backend only while it runs a grant statement
// (sqlc's text starts with its name) in this database: behind a pooler the pid a connection
// reported is not its backend's, and another session's statement must never be cancelled.
const (
	backendAliveSQL = `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND datname = current_database())`
	cancelGrantSQL  = `SELECT pg_catalog.count(pg_catalog.pg_cancel_backend(a.pid)) FROM pg_stat_activity AS a
		WHERE a.pid = $1 AND a.datname = current_database() AND a.query LIKE '-- name: LeaseGrant %'`
)

// awaitBackendExit polls pool, every 2ms, until no backend with pid is left in this database,
// or ctx ends. There is no event to wait on: Postgres does not notify a backend's exit.
func awaitBackendExit(ctx context.Context, pool *pgxpool.Pool, pid uint32) error {
	return db.AwaitFalse(ctx, pool, fmt.Sprintf("await exit of backend %d", pid), backendAliveSQL, int32(pid))
}

// transactionRunningSQL tells whether the backend with pid, in this database, still runs the
// transaction that started at $2.
const transactionRunningSQL = `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
	WHERE pid = $1 AND datname = current_database() AND xact_start = $2)`

// awaitTransactionEnd polls pool, every 2ms, until the backend with pid no longer runs the
// transaction that started at xactStart (it exited, ended that transaction, or runs another),
// or ctx ends. As for awaitBackendExit, there is no event to wait on.
func awaitTransactionEnd(ctx context.Context, pool *pgxpool.Pool, pid uint32, xactStart time.Time) error {
	return db.AwaitFalse(ctx, pool, fmt.Sprintf("await the end of backend %d's transaction", pid), transactionRunningSQL, int32(pid), xactStart)
}

// detached returns a context for cleanup after ctx may have ended (a release, a close, the end
// of a grant left behind): ctx's values without its cancellation, bounded by d.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// closeTimeout bounds the cancel request and the close of a connection fencelock destroys
// because it cannot tell what its session holds.
const closeTimeout = 5 * time.Second

// destroySession closes conn instead of returning it to the pool, because its session may hold
// a lock. With cancel, it first asks the server to cancel whatever the session runs (a lock
// wait), so the session ends promptly rather than when it next writes to the closed socket.
func destroySession(ctx context.Context, conn *pgxpool.Conn, cancel bool) {
	c := conn.Hijack()
	cctx, stop := detached(ctx, closeTimeout)
	defer stop()
	if cancel {
		_ = c.PgConn().CancelRequest(cctx) // best effort: closing ends the session anyway
	}
	_ = c.Close(cctx)
}
