package integration

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testhook"
)

// ctx ending while Acquire waits leaves nothing held and no goroutine behind; so does ctx
// ending at random moments around the holder's expiry, where the grant can race the cancel.
//
// Not parallel: goleak must not see other tests' goroutines.
func TestAcquireCancelledLeavesNothing(t *testing.T) {
	b := setup(t)
	holder := newLessor(t, b.pool, "holder", fencelock.WithoutHeartbeat(), fastBackoff)
	waiter := newLessor(t, b.pool, "waiter", fastBackoff)
	ignore := goleak.IgnoreCurrent()

	lh, err := holder.TryAcquire(b.ctx, "job", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
	_, err = waiter.Acquire(ctx, "job", time.Second)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, "holder", readLease(t, b.ctx, b.pool, "job").Holder)
	require.NoError(t, lh.Release(b.ctx))

	for i := range 100 {
		// Acquire, not TryAcquire: on a loaded machine a grant's reply can arrive after its
		// 18 ms trust window; TryAcquire then ends the useless grant and reports a refusal
		// (ErrNotAcquired), where Acquire tries again. (The lease row, read after such a
		// failure: held by "holder" itself, expired, no other session in the database.)
		lh, err := holder.Acquire(b.ctx, "race", 20*time.Millisecond)
		require.NoError(t, err, "round %d", i)
		ctx, cancel := context.WithTimeout(b.ctx, time.Duration(15+rand.IntN(15))*time.Millisecond)
		lw, err := waiter.Acquire(ctx, "race", time.Minute)
		cancel()
		if err == nil {
			require.NoError(t, lw.Release(b.ctx))
		} else {
			require.ErrorIs(t, err, context.DeadlineExceeded, "round %d", i)
		}
		// Whatever happened, the waiter holds nothing now.
		var held int
		require.NoError(t, b.pool.QueryRow(b.ctx,
			`SELECT count(*) FROM fencelock.leases WHERE holder = 'waiter' AND expires_at > clock_timestamp()`).Scan(&held))
		require.Zero(t, held, "round %d", i)
		_ = lh.Release(b.ctx) // may have expired already
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
	a := newLessor(t, b.pool, "a", fencelock.WithoutHeartbeat())
	l, err := a.Acquire(b.ctx, "job", 50*time.Millisecond)
	require.NoError(t, err)
	waitDone(t, l, 5*time.Second)
	require.ErrorIs(t, l.Err(), fencelock.ErrTrustWindowExpired)
	// Within the listener's linger: on a loaded machine the first grant's reply can come after
	// its 45 ms trust window, and the second attempt then starts the pool's listening
	// connection, which closes a second after the wait (seen in CI under load).
	verifyNoLeakWithin(t, 3*time.Second, ignore)
}

// The cleanup of an abandoned RunLocked grant cancels only a grant statement in this database:
// behind a pooler the pid a connection reported belongs to no backend of its own, or to
// someone else's, whose statement must go on. Here the pid is a live backend running another
// statement: it is neither cancelled nor waited for.
func TestAbandonedGrantCleanupSparesOtherStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	slept := make(chan error, 1)
	go func() {
		_, err := conn.Exec(b.ctx, `SELECT pg_sleep(0.5)`)
		slept <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'`, int32(pid)).Scan(&n)
		return err == nil && n == 1
	}, 5*time.Second, 5*time.Millisecond)
	start := time.Now()
	require.NoError(t, testhook.EndAbandonedGrant(b.ctx, newLessor(t, b.pool, "h"), pid))
	require.Less(t, time.Since(start), 400*time.Millisecond, "the cleanup waited for a backend that ran no grant")
	require.NoError(t, <-slept, "the cleanup cancelled another statement")
}
