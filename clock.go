package fencelock

import "time"

// clock is the time source of the timing of a Lessor and an AdvisoryLocker: trust windows
// (grants, renewals, Err), the heartbeat's and the watchdog's rounds (loop.go) and the trust
// watch. It is the local clock in production and a manual one in the tests of the timing core
// (schedule_test.go), so that those can be driven without waiting and without a server. (The
// waits between Acquire attempts and the polls for a backend's exit use the local clock
// directly: they only pace statements.) Readings carry Go's monotonic clock, which every
// trust-window comparison uses.
type clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f on a goroutine of its own once d has passed, until stopped.
	AfterFunc(d time.Duration, f func()) timer
}

// timer is what clock.AfterFunc returns: *time.Timer's Stop and Reset.
type timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// systemClock is the local clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }
