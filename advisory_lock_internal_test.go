package fencelock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// execOnSession runs sql on the session that holds lk, under its connMu, to break the
// session's state from inside (pg_advisory_unlock_all, say). ErrNotHeld if lk holds no
// session any more.
func execOnSession(ctx context.Context, lk *AdvisoryLock, sql string) error {
	lk.connMu.Lock()
	defer lk.connMu.Unlock()
	if lk.conn == nil {
		return ErrNotHeld
	}
	_, err := lk.conn.Exec(ctx, sql)
	return err
}

// Unlock failure paths: the connection is destroyed, never pooled with a lock.
func TestAdvisoryUnlockFailureDestroysConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, err := NewAdvisoryLocker(b.pool)
	require.NoError(t, err)

	sessionAlive := func(pid uint32) bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n))
		return n == 1
	}

	// The session no longer holds the lock (released behind the locker's back): Unlock says so
	// and closes the session rather than pooling a connection in an unknown state.
	lk, err := a.TryLock(b.ctx, "job")
	require.NoError(t, err)
	require.NoError(t, execOnSession(b.ctx, lk, `SELECT pg_advisory_unlock_all()`))
	require.ErrorIs(t, lk.Unlock(b.ctx), ErrNotHeld)
	require.Eventually(t, func() bool { return !sessionAlive(lk.BackendPID()) }, 5*time.Second, 5*time.Millisecond)

	// The unlock statement fails (the session is in an aborted transaction: "current
	// transaction is aborted"): the session is closed, which releases the lock. (An ended ctx
	// no longer makes it fail: Unlock detaches from it; TestEndedContextAdvisoryUnlock.)
	lk, err = a.TryLock(b.ctx, "job")
	require.NoError(t, err)
	require.Error(t, execOnSession(b.ctx, lk, `BEGIN; SELECT 1/0`))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, lk.Unlock(b.ctx), &pgErr)
	require.Equal(t, "25P02", pgErr.Code, "the unlock failed in the aborted transaction")
	require.Eventually(t, func() bool { return !sessionAlive(lk.BackendPID()) }, 5*time.Second, 5*time.Millisecond)
	otherLocker, err := NewAdvisoryLocker(b.pool)
	require.NoError(t, err)
	other, err := otherLocker.TryLock(b.ctx, "job")
	require.NoError(t, err, "closing the session released the lock")
	require.NoError(t, other.Unlock(b.ctx))

	// A clean unlock pools the connection, and it holds nothing.
	lk, err = a.TryLock(b.ctx, "other")
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(b.ctx))
	require.True(t, sessionAlive(lk.BackendPID()))
	var held int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, lk.BackendPID()).Scan(&held))
	require.Zero(t, held)
}
