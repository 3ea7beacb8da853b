package fencelock

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
	a, err := NewAdvisoryLocker(b.Pool)
	require.NoError(t, err)

	sessionAlive := func(pid uint32) bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n))
		return n == 1
	}

	// The session no longer holds the lock (released behind the locker's back): Unlock says so
	// and closes the session rather than pooling a connection in an unknown state.
	lk, err := a.TryLock(b.Ctx, "job")
	require.NoError(t, err)
	require.NoError(t, execOnSession(b.Ctx, lk, `SELECT pg_advisory_unlock_all()`))
	require.ErrorIs(t, lk.Unlock(b.Ctx), ErrNotHeld)
	require.Eventually(t, func() bool { return !sessionAlive(lk.BackendPID()) }, 5*time.Second, 5*time.Millisecond)

	// The unlock statement fails (the session is in an aborted transaction: "current
	// transaction is aborted"): the session is closed, which releases the lock. (An ended ctx
	// no longer makes it fail: Unlock detaches from it; TestEndedContextAdvisoryUnlock.)
	lk, err = a.TryLock(b.Ctx, "job")
	require.NoError(t, err)
	require.Error(t, execOnSession(b.Ctx, lk, `BEGIN; SELECT 1/0`))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, lk.Unlock(b.Ctx), &pgErr)
	require.Equal(t, "25P02", pgErr.Code, "the unlock failed in the aborted transaction")
	require.Eventually(t, func() bool { return !sessionAlive(lk.BackendPID()) }, 5*time.Second, 5*time.Millisecond)
	otherLocker, err := NewAdvisoryLocker(b.Pool)
	require.NoError(t, err)
	other, err := otherLocker.TryLock(b.Ctx, "job")
	require.NoError(t, err, "closing the session released the lock")
	require.NoError(t, other.Unlock(b.Ctx))

	// A clean unlock pools the connection, and it holds nothing.
	lk, err = a.TryLock(b.Ctx, "other")
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(b.Ctx))
	require.True(t, sessionAlive(lk.BackendPID()))
	var held int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, lk.BackendPID()).Scan(&held))
	require.Zero(t, held)
}

// droppingConn is a client connection whose writes vanish while drop is set: the server never
// sees the statement, so the client waits for a reply that never comes, as on a network that
// went silent. Reads and deadlines are the real connection's.
type droppingConn struct {
	net.Conn
	drop *atomic.Bool
}

func (c droppingConn) Write(p []byte) (int, error) {
	if c.drop.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// An unlock statement that gets no reply is bounded (cleanupTimeout, a deadline on the
// socket): Unlock returns an error after the bound, not before and not much later, with Done
// closed, and pgx closes the connection, which ends the session and its lock on the server
// (once the network speaks again, the cancel request and Terminate get through; else pgx
// closes the socket after 15 s). The bound is the deadline's alone: ctx has none.
func TestAdvisoryUnlockBoundedWhenTheServerIsSilent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		drop  atomic.Bool
		mu    sync.Mutex
		conns []net.Conn // to unblock a failed test's Unlock, so that its cleanup does not hang
	)
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	dialer := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return droppingConn{Conn: c, drop: &drop}, nil
	}
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	a, err := NewAdvisoryLocker(pool)
	require.NoError(t, err)
	lk, err := a.TryLock(b.Ctx, "silent")
	require.NoError(t, err)

	drop.Store(true)
	start := time.Now()
	unlocked := make(chan error, 1)
	go func() { unlocked <- lk.Unlock(context.Background()) }()
	select {
	case err = <-unlocked:
	case <-time.After(cleanupTimeout + 3*time.Second):
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		t.Fatal("Unlock did not return within the bound")
	}
	require.Error(t, err, "the unlock got no reply")
	require.GreaterOrEqual(t, time.Since(start), cleanupTimeout-100*time.Millisecond, "gave up before the bound")
	require.ErrorIs(t, lk.Err(), ErrUnlocked)
	select {
	case <-lk.Done():
	default:
		t.Fatal("Done open after Unlock returned")
	}

	// pgx closes the connection: the server ends the session, and with it the lock.
	drop.Store(false)
	other, err := NewAdvisoryLocker(b.Pool)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		olk, err := other.TryLock(b.Ctx, "silent")
		if err != nil {
			return false
		}
		require.NoError(t, olk.Unlock(b.Ctx))
		return true
	}, 20*time.Second, 10*time.Millisecond, "the silent session still holds the lock")
}
