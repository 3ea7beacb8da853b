package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Issue 30: a blocking AdvisoryLocker.Lock whose ctx ends while the server's grant is on its
// way back (a link with latency) must return only once nothing is held. Before the fix, Lock
// returned context.Canceled at once and the backend kept the lock until the closed
// connection reached it (about one one-way latency later).
func TestAdvisoryLockCancelledWhileGrantInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{proxy: true})
	holderLocker, err := fencelock.NewAdvisoryLocker(e.db.Pool)
	require.NoError(t, err)
	waiterLocker, err := fencelock.NewAdvisoryLocker(e.hpool)
	require.NoError(t, err)
	require.NoError(t, e.hpool.Ping(e.ctx)) // the waiter's connection opens before the latency

	held, err := holderLocker.TryLock(e.ctx, "k")
	require.NoError(t, err)
	// 400 ms each way between the waiter and the server (a cross-zone link, exaggerated): the
	// grant is in flight that long after the server made it (the window only needs to outlast
	// the few ms the test takes to see the grant), and so is the waiter's close of its session.
	require.NoError(t, e.tp.add("slow-replies", "latency", "downstream", map[string]int64{"latency": 400}))
	require.NoError(t, e.tp.add("slow-requests", "latency", "upstream", map[string]int64{"latency": 400}))

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	locked := make(chan error, 1)
	go func() {
		lk, err := waiterLocker.Lock(ctx, "k")
		if err == nil {
			_ = lk.Unlock(context.Background())
		}
		locked <- err
	}()
	// holders counts the sessions of this database that hold or await advisory lock k (granted
	// or not), through the harness pool (no proxy, no latency).
	lockRows := func(granted bool) int {
		var n int
		require.NoError(t, e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_locks AS l
			JOIN pg_database AS d ON d.oid = l.database AND d.datname = current_database()
			WHERE l.locktype = 'advisory' AND l.granted = $1 AND l.pid <> $2`, granted, int32(held.BackendPID())).Scan(&n))
		return n
	}
	waitUntil(t, e.ctx, "the waiter queued for the lock", func() bool { return lockRows(false) == 1 })
	require.NoError(t, held.Unlock(e.ctx))
	waitUntil(t, e.ctx, "the server granted the waiter", func() bool { return lockRows(true) == 1 })
	cancel() // the grant's reply is still on its way (400 ms)

	cancelledAt := time.Now()
	require.ErrorIs(t, <-locked, context.Canceled)
	t.Logf("Lock returned %v after the cancel", time.Since(cancelledAt))
	require.Zero(t, lockRows(true), "Lock returned while its session still held the lock")
	other, err := holderLocker.TryLock(e.ctx, "k")
	require.NoError(t, err, "another locker is refused after Lock gave up")
	require.NoError(t, other.Unlock(e.ctx))
}

// waitUntil polls cond every millisecond until it holds or ctx ends (failing the test).
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
