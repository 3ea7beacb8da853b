package testkit

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// NewPool returns a pool on url, changed by each of configure in turn, closed at test cleanup.
// It fails the test when url does not parse or the pool cannot be made (pgxpool connects
// lazily: a server that cannot be reached is not an error here).
func NewPool(t testing.TB, ctx context.Context, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// MaxConns sets a pool's connection limit to n: every advisory session lock holds a
// connection, and the default (4 connections on 2 cores) is soon exhausted.
func MaxConns(n int32) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) { cfg.MaxConns = n }
}

// ExecMode, when on, makes a pool's connections send their statements with
// pgx.QueryExecModeExec, without named prepared statements, which a PgBouncer older than 1.21
// in transaction mode does not keep (pgtest.PgBouncer.PreparedStatements).
func ExecMode(on bool) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) {
		if on {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		}
	}
}

// UnreachablePool returns a pool whose every connection attempt fails (nothing listens on
// port 1), closed at test cleanup: pgxpool connects lazily, so a call that returns an
// argument error through it provably ran no SQL.
func UnreachablePool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return NewPool(t, context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
}

// Conn takes a connection of pool for the test, released at test cleanup, and returns it with
// the process ID of its backend (pg_backend_pid() as the server knew it at connect).
func Conn(t testing.TB, ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, uint32) {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	return conn, conn.Conn().PgConn().PID()
}
