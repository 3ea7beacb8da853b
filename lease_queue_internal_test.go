package fencelock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/queue"
)

// A release to a queue sends one NOTIFY, to the head's lessor only: the others stay queued and
// are not woken. Judged by the notifications themselves, not by a time: a session of the test
// LISTENs on the channel of each waiter's lessor (one pool each, so one channel each) and counts
// what the release sent there, up to a NOTIFY of the test's own sent after the release returned
// (a listener gets notifications in commit order, so nothing of the release's can come later).
// (Watching the waiters' rows for a refresh instead mistook their own refreshes, every 1.67 s at
// random phases, for wake-ups on a loaded machine.) The 10 s receives are hang bounds.
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
	// The channel each waiter's place carries (every place has one: awaitQueue's notify).
	channels := map[string]string{} // channel -> holder
	rows, err := b.Pool.Query(b.Ctx, `SELECT holder, channel FROM fencelock.lease_waiters WHERE name = 'herd'`)
	require.NoError(t, err)
	for rows.Next() {
		var h, ch string
		require.NoError(t, rows.Scan(&h, &ch))
		channels[ch] = h
	}
	require.NoError(t, rows.Err())
	require.Len(t, channels, len(names), "one channel per waiter's pool")
	c, err := b.Pool.Acquire(b.Ctx)
	require.NoError(t, err)
	listener := c.Hijack()
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	const sentinel = "herd_test_sentinel"
	for ch := range channels {
		_, err := listener.Exec(b.Ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		require.NoError(t, err)
	}
	_, err = listener.Exec(b.Ctx, "LISTEN "+sentinel)
	require.NoError(t, err)

	require.NoError(t, lh.Release(b.Ctx))
	got := receive(t, results[0], 10*time.Second)
	require.NoError(t, got.err)
	require.Equal(t, "w0", got.lease.Holder())
	_, err = b.Pool.Exec(b.Ctx, "NOTIFY "+sentinel)
	require.NoError(t, err)
	wakes := map[string][]queue.Wakeup{} // holder -> the wake-ups sent to its channel
	for {
		ctx, cancel := context.WithTimeout(b.Ctx, 10*time.Second) // a hang bound
		n, err := listener.WaitForNotification(ctx)
		cancel()
		require.NoError(t, err, "the test's own NOTIFY did not arrive")
		if n.Channel == sentinel {
			break
		}
		wk, err := queue.ParseWake(n.Payload)
		require.NoError(t, err)
		wakes[channels[n.Channel]] = append(wakes[channels[n.Channel]], wk)
	}
	require.Len(t, wakes["w0"], 1, "the release woke the head once")
	require.Equal(t, "w0", wakes["w0"][0].Holder)
	require.Equal(t, "herd", wakes["w0"][0].Name)
	require.Equal(t, int64(got.lease.Token()), wakes["w0"][0].Token, "the head's wake-up carried its grant")
	for _, h := range names[1:] {
		require.Empty(t, wakes[h], "%s was woken by a release for the head", h)
	}
	awaitQueue(t, b.Ctx, b.Pool, "herd", true, names[1:]...) // the others stay queued
	require.NoError(t, got.lease.Release(b.Ctx))
	for i := 1; i < len(names); i++ {
		got := receive(t, results[i], 10*time.Second)
		require.NoError(t, got.err)
		require.NoError(t, got.lease.Release(b.Ctx))
	}
}
