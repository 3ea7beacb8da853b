package fencelock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// A lessor that has waited, held and released stays attached to its pool's notifier for a
// while (listenerLinger, 1 s): when it waits again at once, its first attempt already gives the
// queue its channel, so the next release wakes it by NOTIFY instead of leaving it to poll. (Until
// this was restored, an idle lessor let go of the notifier at once, and each such wait took a
// place with no channel: one more statement per grant under contention, 4.15 commits a grant
// instead of 3.2 in BenchmarkContention/Lease.)
func TestQueuePlaceCarriesChannelAfterRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := newLessor(t, b.Pool, "linger-holder")
	ahead := newLessor(t, b.Pool, "linger-ahead", fastBackoff)
	// The waiter polls only every 5 s: a place without a channel would stay so until then.
	slow := fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second))
	waiter := newLessor(t, b.Pool, "linger-waiter", slow)
	const name = "linger"
	channelOf := func() string {
		var ch *string
		err := b.Pool.QueryRow(b.Ctx, `SELECT channel FROM fencelock.lease_waiters WHERE name = $1 AND holder = 'linger-waiter'`, name).Scan(&ch)
		require.NoError(t, err)
		if ch == nil {
			return ""
		}
		return *ch
	}
	for round := range 2 {
		held, err := holder.TryAcquire(b.Ctx, name, 10*time.Second)
		require.NoError(t, err)
		first := fencetest.AcquireAsync(b.Ctx, ahead, name, 10*time.Second)
		awaitWaiters(t, b, name, 1)
		// Behind another waiter: a wait that joins at the head looks again 20 ms later anyway
		// (joinRecheck), which would give the queue its channel by the second attempt.
		got := fencetest.AcquireAsync(b.Ctx, waiter, name, 10*time.Second)
		awaitWaiters(t, b, name, 2)
		t.Logf("round %d channel %q", round, channelOf())
		if round == 1 {
			// The waiter released a lease a moment ago (round 0): its first attempt knew the
			// channel.
			require.NotEmpty(t, channelOf(), "a wait of a lessor that just released took a place without its channel")
		}
		require.NoError(t, held.Release(b.Ctx))
		for _, ch := range []<-chan acquired{first, got} {
			a := <-ch
			require.NoError(t, a.Err)
			require.NoError(t, a.Lease.Release(b.Ctx))
		}
	}
}
