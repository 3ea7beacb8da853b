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
//
// The waiter holds the lease (handed to it after a wait), the holder and another lessor queue
// behind it, and the waiter releases and calls Acquire at once: it takes a place behind the
// other waiter (the holder got the release's hand-off). A round counts only if the waiter's
// place was read less than the linger after the release began (so its first attempt came
// within the linger, whatever the machine's speed); a slower round proves nothing either way
// and is run again, up to five times. The place is read before the waiter's next attempt,
// which without a channel comes after 5 s (its backoff). The 10 s receives are hang bounds.
func TestQueuePlaceCarriesChannelAfterRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const linger = time.Second // fencelock's listenerLinger
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
	release := func(ch <-chan acquired) *fencelock.Lease {
		t.Helper()
		a := fencetest.Receive(t, ch, 10*time.Second)
		require.NoError(t, a.Err)
		return a.Lease
	}

	// The waiter waits, which attaches it to the notifier, and is handed the lease. (At the
	// head, it looks again 20 ms after joining, joinRecheck: its place then has the channel,
	// and the release wakes it.)
	held, err := holder.TryAcquire(b.Ctx, name, 10*time.Second)
	require.NoError(t, err)
	got := fencetest.AcquireAsync(b.Ctx, waiter, name, 10*time.Second)
	awaitQueue(t, b.Ctx, b.Pool, name, true, "linger-waiter")
	require.NoError(t, held.Release(b.Ctx))
	mine := release(got)

	for round := 0; ; round++ {
		require.Less(t, round, 5, "no round ran within the linger of %v: the machine is too slow to judge this", linger)
		h := fencetest.AcquireAsync(b.Ctx, holder, name, 10*time.Second)
		awaitQueue(t, b.Ctx, b.Pool, name, true, "linger-holder")
		a := fencetest.AcquireAsync(b.Ctx, ahead, name, 10*time.Second)
		awaitQueue(t, b.Ctx, b.Pool, name, true, "linger-holder", "linger-ahead")
		start := time.Now() // before the release, which arms the linger
		require.NoError(t, mine.Release(b.Ctx))
		got := fencetest.AcquireAsync(b.Ctx, waiter, name, 10*time.Second)
		awaitQueue(t, b.Ctx, b.Pool, name, false, "linger-ahead", "linger-waiter")
		channel := channelOf()
		elapsed := time.Since(start)
		t.Logf("round %d: channel %q read %v after the release", round, channel, elapsed)
		require.NoError(t, release(h).Release(b.Ctx))
		require.NoError(t, release(a).Release(b.Ctx))
		mine = release(got)
		if elapsed < linger {
			require.NotEmpty(t, channel, "a wait of a lessor that just released took a place without its channel")
			break
		}
	}
	require.NoError(t, mine.Release(b.Ctx))
}
