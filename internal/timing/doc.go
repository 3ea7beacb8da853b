// Package timing is the timing core of fencelock's lessors and advisory lockers: the clock
// they read, the schedule of a lease (when it is renewed, retried, left to lapse, when its
// holder stops trusting it, how long a waiter sleeps), the loop that runs rounds while
// something is held, a min-heap of items by time, and the exponential backoff behind
// fencelock.ExponentialBackoff.
//
// # Narrow interface
//
// Nothing here knows a lease, a lessor or a database. The schedule is pure functions of their
// arguments (the current time is one of them), so it is table-tested without a server and
// without the wall clock. [Loop] runs a step func the owner gives it; [Heap] keeps any item
// whose slot index the owner keeps for it (an accessor func); [Clock] is the local clock in
// production and [timingtest.ManualClock] in tests. The package runs no SQL.
//
// # Sources
//
// The trust window (a holder stops trusting its grant at send time + TTL - safety margin) is
// the lease of Gray and Cheriton (1989) as Kleppmann (2016) applies it; the loop that costs no
// goroutine between rounds is the idiom of time.AfterFunc; the backoff is the "equal jitter"
// of the AWS Architecture Blog's "Exponential Backoff and Jitter" (Brooker, 2015).
package timing
