package integration

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// Behind PgBouncer in transaction mode (no LISTEN: waiters poll), permits are granted up to
// the limit, a waiter polls its way to the permit a release frees, and a try does not barge
// past it.
func TestSemaphoreBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, pool := viaPgBouncer(t, b, "transaction")
	h, err := fencelock.NewSemaphore(newLessor(t, pool, "pooled-h"), "sem:pooled", 2)
	require.NoError(t, err)
	p1, err := h.TryAcquire(b.Ctx, 10*time.Second)
	require.NoError(t, err)
	p2, err := h.Acquire(b.Ctx, 10*time.Second)
	require.NoError(t, err)
	w, err := fencelock.NewSemaphore(newLessor(t, pool, "pooled-w", fastBackoff), "sem:pooled", 2)
	require.NoError(t, err)
	waiting := fencetest.PermitAsync(b.Ctx, w, 10*time.Second)
	waitQueued(t, b, h, 1)
	_, err = newSemaphore(t, b, "pooled-try", "sem:pooled", 2).TryAcquire(b.Ctx, time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.NoError(t, p1.Release(b.Ctx))
	got := fencetest.Receive(t, waiting, 5*time.Second)
	require.NoError(t, got.Err)
	require.Equal(t, p1.Name(), got.Lease.Name())
	require.Greater(t, got.Lease.Token(), p1.Token())
	require.NoError(t, got.Lease.Release(b.Ctx))
	require.NoError(t, p2.Release(b.Ctx))
	require.Equal(t, fencelock.SemaphoreState{Limit: 2}, semState(t, b, h))
}
