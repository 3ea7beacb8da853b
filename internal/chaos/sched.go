package chaos

import (
	"time"
)

// AwaitClosing waits until done closes and returns how late a control timer, run in the same
// goroutine meanwhile, was at worst after from(): the scheduler's delay around the closing,
// which no holder avoids (a process descheduled for 400 ms on a loaded machine sees its own
// timers, and the library's, 400 ms late). [TrustWithinExpiry] adds it to the slack a Done
// closing has (Op.Late), so that a Done the library closed late is still caught while one
// the machine delayed is not counted against it.
//
// The control timer is re-armed every 10 ms and its lateness is measured from the instant
// it was due; a timer still pending when done closes counts for how overdue it is then. Only
// lateness after from() counts (a timer due earlier counts from then): a delay before the
// trust window ended is not the closing's.
func AwaitClosing(done <-chan struct{}, from func() time.Time) time.Duration {
	const period = 10 * time.Millisecond
	var ct controlTimer
	timer := time.NewTimer(period)
	defer timer.Stop()
	due := time.Now().Add(period)
	for {
		select {
		case <-done:
			return ct.worst(from(), due, time.Now())
		case <-timer.C:
			ct.seen(due, time.Now())
			due = time.Now().Add(period)
			timer.Reset(period)
		}
	}
}

// controlTimer is the record of a control timer's firings: when each was due and seen.
type controlTimer struct{ dues, seens []time.Time }

// seen records a firing; it keeps at least the last 500 (5 s at 10 ms, more than a closing
// looks back).
func (c *controlTimer) seen(due, seen time.Time) {
	if len(c.dues) >= 1000 {
		c.dues = append(c.dues[:0], c.dues[500:]...)
		c.seens = append(c.seens[:0], c.seens[500:]...)
	}
	c.dues = append(c.dues, due)
	c.seens = append(c.seens, seen)
}

// worst returns the largest lateness after start of the recorded firings and of the timer
// pending at now (due pending), each counted from the later of its due time and start.
func (c *controlTimer) worst(start, pending, now time.Time) time.Duration {
	late := func(due, seen time.Time) time.Duration {
		if due.Before(start) {
			due = start
		}
		return max(0, seen.Sub(due))
	}
	w := late(pending, now)
	for i := range c.dues {
		w = max(w, late(c.dues[i], c.seens[i]))
	}
	return w
}
