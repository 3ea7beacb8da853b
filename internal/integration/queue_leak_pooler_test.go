package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// The listening connection killed (pg_terminate_backend): the waiter falls back to polling and
// is still granted by the release (it finds the hand-off at its next poll), the connection is
// opened again, and once nothing is held or awaited no goroutine is left (the connection closes
// a second after the lessor's last wait or lease). The grant must come within queueHandOffHang
// of the release.
//
// Not parallel: goleak must not see other tests' goroutines.
func TestQueueListenerTerminated(t *testing.T) {
	b := setup(t)
	pool := newPool(t, b.Ctx, b.DB.URL) // the waiter's own, for one listening connection of its own
	ignore := goleak.IgnoreCurrent()
	holder := newLessor(t, b.Pool, "holder")
	waiter := newLessor(t, pool, "waiter", fastBackoff)
	lh, err := holder.TryAcquire(b.Ctx, "deaf", time.Minute)
	require.NoError(t, err)
	w := fencetest.AcquireAsync(b.Ctx, waiter, "deaf", time.Minute)
	awaitQueue(t, b.Ctx, b.Pool, "deaf", true, "waiter")
	pids := listeners(t, b.Ctx, b.Pool)
	require.Len(t, pids, 1)
	var ok bool
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT pg_terminate_backend($1)`, pids[0]).Scan(&ok))
	require.True(t, ok)
	// The waiter refreshes its place without a channel: it polls now.
	awaitQueue(t, b.Ctx, b.Pool, "deaf", false, "waiter")
	require.NoError(t, lh.Release(b.Ctx))
	got := fencetest.Receive(t, w, queueHandOffHang)
	require.NoError(t, got.Err)
	require.Equal(t, "waiter", got.Lease.Holder())
	// It listens again, on a new session.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if now := listeners(t, b.Ctx, b.Pool); len(now) == 1 && now[0] != pids[0] {
			break
		}
		require.True(t, time.Now().Before(deadline), "the listening connection was not opened again")
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, got.Lease.Release(b.Ctx))
	verifyNoLeakWithin(t, 3*time.Second, ignore)
	require.Empty(t, listeners(t, b.Ctx, b.Pool))
}

// queueHandOffHang bounds how soon after a release a polling waiter (fastBackoff: polls 5 ms
// apart at most) must have the hand-off. A hang bound, not the machine's speed: a waiter that
// never finds the hand-off has the lease only when the holder's minute-long TTL ends, if at all.
const queueHandOffHang = 10 * time.Second

// Behind PgBouncer in transaction mode LISTEN cannot work (the next statement may run on
// another server session): the lessor detects the pooler (its backend pid is not the one the
// connection reported) and its waiters poll, with no channel in their place; they are still
// served first come, first served, by hand-offs they find at their next poll (within
// queueHandOffHang of each release).
func TestQueueBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pgtest.NeedPgBouncer(t)
	bouncer, err := pgtest.StartPgBouncer(b.Ctx, b.DB.Server, "transaction")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, bouncer.Close()) })
	pooled := goosePool(t, b.Ctx, bouncer.URL(b.DB.Name), !bouncer.PreparedStatements())

	holder := newLessor(t, pooled, "holder")
	lh, err := holder.TryAcquire(b.Ctx, "bounced", time.Minute)
	require.NoError(t, err)
	var names []string
	var results []<-chan acquired
	for i := range 3 {
		names = append(names, fmt.Sprintf("w%d", i))
		results = append(results, fencetest.AcquireAsync(b.Ctx, newLessor(t, pooled, names[i], fastBackoff), "bounced", time.Minute))
		awaitQueue(t, b.Ctx, b.Pool, "bounced", false, names...)
	}
	for _, e := range readQueue(t, b.Ctx, b.Pool, "bounced") {
		require.False(t, e.Notify, "%s listens behind a transaction pooler", e.Holder)
	}
	require.Empty(t, listeners(t, b.Ctx, b.Pool))
	prev := lh
	for i := range names {
		require.NoError(t, prev.Release(b.Ctx))
		got := fencetest.Receive(t, results[i], queueHandOffHang)
		require.NoError(t, got.Err)
		require.Equal(t, names[i], got.Lease.Holder())
		prev = got.Lease
	}
	require.NoError(t, prev.Release(b.Ctx))
}
