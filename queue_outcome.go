package fencelock

import "time"

// What a grant statement that waits in a queue (LeaseAcquire, SemaphoreAcquire) tells its
// caller: its outcome, and, when refused, what the next attempt's timing depends on.

// The outcomes of LeaseAcquire (SemaphoreAcquire uses 1, 3 and 4 alike).
const (
	outcomeGranted = 1 // granted by this statement
	outcomeMine    = 2 // handed to this wait before the statement
	outcomeHanded  = 3 // handed to this wait by a release after the statement's snapshot
	outcomeQueued  = 4 // refused, in the queue
)

// joinRecheck: a wait that joined a queue at its head tries again this soon, once, in case a
// release ran concurrently with its joining and, not seeing it yet, woke nobody.
const joinRecheck = 20 * time.Millisecond

// attemptInfo is what a refused attempt tells the next one's timing.
type attemptInfo struct {
	joined    bool          // the attempt joined the queue (a new place, not a refresh)
	listening bool          // the attempt carried the lessor's NOTIFY channel
	ahead     int64         // live waiters ahead
	remaining time.Duration // the holder's remaining TTL (0: free or unknown)
	permits   int           // a semaphore's limit, as the attempt read it (0: unknown)
	late      bool          // granted, but the reply came after the grant's trust window
}
