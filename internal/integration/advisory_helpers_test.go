package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// The advisory lock helpers of the fault, pooler, command and metrics tests here: copies of
// the root package's (advisory_test.go), now that the advisory lock tests that need only a
// server live there.

// bigPool opens a pool of 40 connections on the test's database: every session lock holds a
// connection, and the default pool (4 connections on 2 cores) is soon exhausted.
func bigPool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newLocker returns an advisory locker on pool with opts, failing the test on error.
func newLocker(t *testing.T, pool *pgxpool.Pool, opts ...fencelock.AdvisoryOption) *fencelock.AdvisoryLocker {
	t.Helper()
	a, err := fencelock.NewAdvisoryLocker(pool, opts...)
	require.NoError(t, err)
	return a
}

// advisoryHolders lists the backend pids holding (granted) or waiting for key.
func advisoryHolders(t *testing.T, ctx context.Context, pool *pgxpool.Pool, key int64, granted bool) []uint32 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted = $2
		  AND ((classid::bigint << 32) | objid::bigint) = $1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY pid`, key, granted)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	require.NoError(t, err)
	return pids
}

// keyOf returns the int64 advisory lock key that a derives for name.
func keyOf(t *testing.T, a *fencelock.AdvisoryLocker, name string) int64 {
	t.Helper()
	k, err := a.Key(name)
	require.NoError(t, err)
	v, ok := k.Int64()
	require.True(t, ok)
	return v
}
