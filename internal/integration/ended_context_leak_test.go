package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
)

// A Release with an ended ctx stays bounded by its own timeout (5 s) when its statement cannot
// finish (another transaction holds the lease row FOR UPDATE), and leaves no goroutine behind.
// It returns the bound's DeadlineExceeded after 5 s at least. It must return within 12 s: a
// hang bound, not the machine's speed (a loaded machine adds the statement's cancellation to
// the 5 s). A Release without a bound of its own would wait for the row, which the test frees
// only after it returns, for good; one bounded by the caller's ended ctx returns at once,
// without DeadlineExceeded.
//
// Not parallel: goleak must not see other tests' goroutines.
func TestEndedContextLeaseReleaseBounded(t *testing.T) {
	b := setup(t)
	l := newLessor(t, b.Pool, "holder")
	ignore := goleak.IgnoreCurrent()
	lease, err := l.TryAcquire(b.Ctx, "ended:bounded", time.Minute)
	require.NoError(t, err)
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(b.Ctx, `SELECT 1 FROM fencelock.leases WHERE name = 'ended:bounded' FOR UPDATE`)
	require.NoError(t, err)

	const hang = 12 * time.Second
	start := time.Now()
	released := make(chan error, 1)
	go func() { released <- lease.Release(endedCtx(b.Ctx)) }()
	select {
	case err = <-released:
	case <-time.After(hang):
		t.Fatalf("the release did not return within %v (a hang bound; its own bound is 5 s)", hang)
	}
	elapsed := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the release's own bound, not the caller's ended ctx")
	require.GreaterOrEqual(t, elapsed, 5*time.Second, "the release did not wait its own bound")
	t.Logf("the release returned after %v", elapsed.Round(time.Millisecond))
	require.ErrorIs(t, lease.Err(), fencelock.ErrReleased, "Done closes before the statement, whatever it does")
	require.NoError(t, tx.Rollback(b.Ctx))
	// The client gave the statement up; its backend may still run it once the row is free
	// (the release is scoped to the grant, so that is harmless), else the grant stays until
	// its TTL. Either way a second Release ends it.
	if err := lease.Release(b.Ctx); err != nil {
		require.ErrorIs(t, err, fencelock.ErrNotHeld)
	}
	requireFree(t, b, "ended:bounded")
	verifyNoLeakWithin(t, 5*time.Second, ignore)
}
