package timing

import "time"

// Clock is the time source of the timing of a lessor and an advisory locker: trust windows
// (grants, renewals, Err), the heartbeat's and the watchdog's rounds ([Loop]) and the trust
// watch. It is [System] in production and a manual one in tests (package timingtest), so that
// those can be driven without waiting and without a server. Readings carry Go's monotonic
// clock, which every trust-window comparison uses. Implementations are safe for concurrent
// use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f on a goroutine of its own once d has passed, until stopped.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is what Clock.AfterFunc returns: *time.Timer's Stop and Reset.
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it stopped an armed timer.
	Stop() bool
	// Reset arms the timer to fire d from now; it reports whether it was armed.
	Reset(d time.Duration) bool
}

// System is the local clock: time.Now and time.AfterFunc. Its zero value is ready to use.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }

// AfterFunc returns time.AfterFunc(d, f).
func (System) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
