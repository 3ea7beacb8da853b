package fencelock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A grant whose reply arrives after its trust window is released on a context of its own, so
// the name is free at once even when the caller's ctx ended meanwhile (before, the release
// used the caller's ctx, was never sent, and the name stayed held for a whole TTL). The try's
// error is ErrNotAcquired (errors.Is) and says the grant came late.
func TestLateGrantReleasedAfterCallerCancels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := testLessor(t, b.Pool, "late", WithSafetyMargin(9900*time.Millisecond), WithHeartbeatInterval(30*time.Millisecond))
	ctx, cancel := context.WithCancel(b.Ctx)
	l.afterGrant = func() {
		cancel()                           // the caller gives up as the reply arrives...
		time.Sleep(150 * time.Millisecond) // ...which arrives past the 100 ms trust window
	}
	lease, err := l.TryAcquire(ctx, "slow", 10*time.Second)
	require.ErrorIs(t, err, ErrNotAcquired)
	require.Nil(t, lease)
	// It says what happened, not "held by another holder" (nobody else held it).
	require.EqualError(t, err, `fencelock: not acquired: lease "slow" was granted, but its reply came after its trust window (TTL 10s): released at once`)
	require.True(t, leaseExpired(t, b.Ctx, b.Pool, "slow"), "the late grant is still held")
	other, err := testLessor(t, b.Pool, "other").TryAcquire(b.Ctx, "slow", time.Second)
	require.NoError(t, err)
	require.NoError(t, other.Release(b.Ctx))
}
