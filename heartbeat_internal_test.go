package fencelock

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The heartbeat renews due leases in batches of at most maxRenewBatch, with at most
// maxRenewInFlight statements at a time: with 12,000 leases due, one round takes two batches
// of 5,000 and leaves 2,000 queued until a batch returns. A lease about to lapse is left to
// its timer, and one that Renew moved is queued again at its new time. (No database: the
// renewal statements are never sent.)
func TestHeartbeatTakeBatches(t *testing.T) {
	clk := newManualClock()
	l := newLessor(nil, lessorConfig{clock: clk})
	lt := leaseTimes{ttl: 9 * time.Second, heartbeat: 3 * time.Second, margin: time.Second}
	start := clk.Now()
	sent := start.Add(-3 * time.Second) // granted a heartbeat ago: due now
	add := func(name string, sent time.Time) *Lease {
		lease := newLease(l, name, 1, lt, sent, time.Time{})
		l.mu.Lock()
		l.active[name] = lease
		l.enqueueLocked(lease)
		l.mu.Unlock()
		return lease
	}
	for i := range 12_000 {
		add(fmt.Sprintf("due:%d", i), sent)
	}
	lapsing := add("lapsing", start.Add(-lt.ttl+lt.margin+2*time.Millisecond)) // window ends in 2 ms
	moved := add("moved", sent)
	moved.renewed(start, time.Time{}) // renewed by Lease.Renew since it was queued

	batches, next, ok := l.take(start)
	require.True(t, ok)
	require.Len(t, batches, maxRenewInFlight)
	for _, batch := range batches {
		require.Len(t, batch, maxRenewBatch)
	}
	require.Equal(t, maxRenewInFlight, l.inFlight)
	require.Equal(t, start.Add(time.Hour), next, "with every statement slot taken, the loop waits for a batch to return")
	l.mu.Lock()
	queued := l.queue.Len()
	l.mu.Unlock()
	// The 2,000 due leases left, and "moved" (re-queued at its new time); "lapsing" is not queued
	// unless it was popped after the slots were full.
	require.Contains(t, []int{2001, 2002}, queued)
	for _, batch := range batches {
		for _, lease := range batch {
			require.NotSame(t, lapsing, lease)
			require.NotSame(t, moved, lease)
		}
	}
	require.True(t, l.queue.queued(moved), "a lease Renew moved was dropped from the heap")
}
