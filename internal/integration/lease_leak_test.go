package integration

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
)

// ctx ending while Acquire waits leaves nothing held and no goroutine behind; so does ctx
// ending at random moments around the holder's expiry, where the grant can race the cancel.
//
// Not parallel: goleak must not see other tests' goroutines.
func TestAcquireCancelledLeavesNothing(t *testing.T) {
	b := setup(t)
	holder := newLessor(t, b.Pool, "holder", fencelock.WithoutHeartbeat(), fastBackoff)
	waiter := newLessor(t, b.Pool, "waiter", fastBackoff)
	ignore := goleak.IgnoreCurrent()

	lh, err := holder.TryAcquire(b.Ctx, "job", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.Ctx, 50*time.Millisecond)
	_, err = waiter.Acquire(ctx, "job", time.Second)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, "holder", readLease(t, b.Ctx, b.Pool, "job").Holder)
	require.NoError(t, lh.Release(b.Ctx))

	for i := range 100 {
		// Acquire, not TryAcquire: on a loaded machine a grant's reply can arrive after its
		// 18 ms trust window; TryAcquire then ends the useless grant and reports a refusal
		// (ErrNotAcquired), where Acquire tries again. (The lease row, read after such a
		// failure: held by "holder" itself, expired, no other session in the database.)
		lh, err := holder.Acquire(b.Ctx, "race", 20*time.Millisecond)
		require.NoError(t, err, "round %d", i)
		ctx, cancel := context.WithTimeout(b.Ctx, time.Duration(15+rand.IntN(15))*time.Millisecond)
		lw, err := waiter.Acquire(ctx, "race", time.Minute)
		cancel()
		if err == nil {
			require.NoError(t, lw.Release(b.Ctx))
		} else {
			require.ErrorIs(t, err, context.DeadlineExceeded, "round %d", i)
		}
		// Whatever happened, the waiter holds nothing now.
		var held int
		require.NoError(t, b.Pool.QueryRow(b.Ctx,
			`SELECT count(*) FROM fencelock.leases WHERE holder = 'waiter' AND expires_at > clock_timestamp()`).Scan(&held))
		require.Zero(t, held, "round %d", i)
		_ = lh.Release(b.Ctx) // may have expired already
	}
	// The waiter's listening connection closes a second after its last wait (listenerLinger).
	verifyNoLeakWithin(t, 3*time.Second, ignore)
}

// The heartbeat goroutine ends with the last lease, also when that lease ends by its trust
// window rather than by Release.
//
// Not parallel: goleak must not see other tests' goroutines.
func TestHeartbeatStopsAfterTrustWindowLoss(t *testing.T) {
	b := setup(t)
	ignore := goleak.IgnoreCurrent()
	a := newLessor(t, b.Pool, "a", fencelock.WithoutHeartbeat())
	l, err := a.Acquire(b.Ctx, "job", 50*time.Millisecond)
	require.NoError(t, err)
	waitDone(t, l, 5*time.Second)
	require.ErrorIs(t, l.Err(), fencelock.ErrTrustWindowExpired)
	// Within the listener's linger: on a loaded machine the first grant's reply can come after
	// its 45 ms trust window, and the second attempt then starts the pool's listening
	// connection, which closes a second after the wait (seen in CI under load).
	verifyNoLeakWithin(t, 3*time.Second, ignore)
}
