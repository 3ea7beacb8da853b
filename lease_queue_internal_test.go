package fencelock

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/queue"
)

// A release to a queue sends one NOTIFY, to the head's lessor only: the others stay queued and
// are not woken (each would otherwise poll and refresh its place: their rows stay as they were).
func TestReleaseWakesOnlyTheHead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := testLessor(t, b.Pool, "holder")
	lh, err := holder.TryAcquire(b.Ctx, "herd", time.Minute)
	require.NoError(t, err)
	var names []string
	var results []<-chan acquired
	for i := range 5 {
		names = append(names, fmt.Sprintf("w%d", i))
		// One pool per waiter: each lessor has a listening connection of its own, as the
		// processes of a fleet do.
		results = append(results, acquireAsync(b.Ctx, testLessor(t, newPool(t, b.Ctx, b.DB.URL), names[i]), "herd", time.Minute))
		awaitQueue(t, b.Ctx, b.Pool, "herd", true, names...)
	}
	refreshed := func() map[string]time.Time {
		rows, err := b.Pool.Query(b.Ctx, `SELECT holder, expires_at FROM fencelock.lease_waiters WHERE name = 'herd'`)
		require.NoError(t, err)
		m := map[string]time.Time{}
		for rows.Next() {
			var h string
			var at time.Time
			require.NoError(t, rows.Scan(&h, &at))
			m[h] = at
		}
		require.NoError(t, rows.Err())
		return m
	}
	before := refreshed()
	wakes := queue.WakeupsSent()
	require.NoError(t, lh.Release(b.Ctx))
	got := receive(t, results[0], time.Second)
	require.NoError(t, got.err)
	require.Equal(t, "w0", got.lease.Holder())
	after := refreshed()
	require.GreaterOrEqual(t, queue.WakeupsSent()-wakes, int64(1))
	for _, h := range names[1:] {
		// A woken waiter would have run an attempt, which refreshes its place (a later expiry).
		require.Equal(t, before[h], after[h], "%s was woken by a release for the head", h)
	}
	require.NoError(t, got.lease.Release(b.Ctx))
	for i := 1; i < len(names); i++ {
		got := receive(t, results[i], time.Second)
		require.NoError(t, got.err)
		require.NoError(t, got.lease.Release(b.Ctx))
	}
}
