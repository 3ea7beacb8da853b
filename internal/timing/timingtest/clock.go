// Package timingtest holds a manual [timing.Clock] for tests: time moves only when the test
// advances it, and the clock's timers run, in order of their due time, on the goroutine that
// advances it. It lets the tests of the timing core (loops, heartbeats, trust watches,
// watchdogs) run step by step, without the wall clock and without a server.
package timingtest

import (
	"sort"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/timing"
)

// ManualClock is a [timing.Clock] that moves only when a test advances it: its AfterFunc
// timers run, in order of their due time, on the goroutine that calls Advance. Safe for
// concurrent use.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	c     *ManualClock
	at    time.Time
	f     func()
	armed bool
}

// NewManualClock returns a manual clock that reads 2026-11-23 12:00 UTC.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arms a timer that runs f in Advance once the clock has moved d on.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) timing.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, at: c.now.Add(d), f: f, armed: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.at, t.armed = t.c.now.Add(d), true
	return was
}

// Advance moves the clock forward by d, running each timer that comes due on the way, at its
// due time, in order.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var due *manualTimer
		for _, t := range c.timers {
			if t.armed && !t.at.After(end) {
				due = t
				break
			}
		}
		if due == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		if due.at.After(c.now) {
			c.now = due.at
		}
		due.armed = false
		c.mu.Unlock()
		due.f()
	}
}

// Set moves the clock to now without running any timer: a process paused past its timers.
func (c *ManualClock) Set(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}
