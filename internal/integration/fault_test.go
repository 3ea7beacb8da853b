package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// grantTokens takes and releases the lease name n times and returns the tokens.
func grantTokens(t *testing.T, ctx context.Context, l *fencelock.Lessor, name string, n int) []int64 {
	t.Helper()
	var out []int64
	for range n {
		lease, err := l.TryAcquire(ctx, name, time.Minute)
		require.NoError(t, err)
		out = append(out, int64(lease.Token()))
		require.NoError(t, lease.Release(ctx))
	}
	return out
}

// acquireRetrying grants name, retrying while the pool reconnects after a fault. It fails the
// test after limit.
func acquireRetrying(t *testing.T, ctx context.Context, l *fencelock.Lessor, name string, limit time.Duration) *fencelock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		lease, err := l.Acquire(ctx, name, time.Minute)
		if err == nil {
			return lease
		}
		require.NoError(t, ctx.Err(), "last error: %v", err)
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond): // the server is restarting: nothing to await but a connection
		}
	}
}

// maxOf returns the largest of xs, which must not be empty.
func maxOf(xs []int64) int64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// Backends terminated under a holder: the next grants still carry larger tokens, and the
// holder's heartbeat rides over the lost connection (the pool reconnects) without losing the
// lease.
func TestTokensAfterBackendTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := newLessor(t, b.Pool, "a", fencelock.WithHeartbeatInterval(30*time.Millisecond))
	before := grantTokens(t, b.Ctx, a, "job", 5)
	held, err := a.TryAcquire(b.Ctx, "held", time.Second)
	require.NoError(t, err)

	// Make sure the pool has several connections, then kill every one of them.
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := b.Pool.Acquire(b.Ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	rows, err := b.Pool.Query(b.Ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	require.NoError(t, err)
	var pids []uint32
	for rows.Next() {
		var pid uint32
		require.NoError(t, rows.Scan(&pid))
		pids = append(pids, pid)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, pids)
	for _, pid := range pids {
		require.NoError(t, b.DB.Server.TerminateBackend(b.Ctx, pid))
	}

	after := acquireRetrying(t, b.Ctx, a, "job", 10*time.Second)
	require.Greater(t, int64(after.Token()), maxOf(before))
	require.NoError(t, after.Release(b.Ctx))
	// Two TTLs later, the held lease is still held: renewals resumed on fresh connections.
	_, err = b.Pool.Exec(b.Ctx, `SELECT pg_sleep(2)`)
	require.NoError(t, err)
	require.NoError(t, held.Err())
	require.NoError(t, held.Renew(b.Ctx))
	require.NoError(t, held.Release(b.Ctx))
}
