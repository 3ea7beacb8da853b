package timing

import (
	"sync"
	"time"
)

// Loop is the one idiom for work that runs in rounds while its owner holds something: a
// lessor's heartbeat and an advisory locker's watchdog. Rounds run on the clock's timer (each
// on a goroutine of the runtime's, none between rounds), one at a time. The owner arms the
// loop when it takes its first grant, asks for an earlier round when a grant needs one sooner
// ([Loop.WakeAt]), and stops it when it holds nothing; each round's step returns when the next
// round is due, or that nothing is held. So an owner that holds nothing owns no goroutine
// (and no armed timer, but for a round armed as its last grant ended, which runs once and
// stops), a grant held for less than one round costs no goroutine, and neither needs a Close.
//
// The running flag is guarded by the owner's mutex, the same lock under which the owner adds
// and removes grants and under which a step looks at them: a step that sees nothing held
// clears it under that lock ([Loop.StopLocked]), so a grant added at the same moment finds it
// cleared and arms the loop again, and is never left without rounds. The methods are safe for
// concurrent use under that contract.
type Loop struct {
	clock   Clock
	step    func(now time.Time) (next time.Time, ok bool) // one round; ok false: nothing held (StopLocked called)
	running bool                                          // guarded by the owner's mutex

	mu      sync.Mutex
	t       Timer     // runs round; nil until first armed
	armed   bool      // t is set to fire at at
	at      time.Time // when t fires, while armed
	busy    bool      // a round is running
	wanted  time.Time // while busy: the earliest round asked for meanwhile; zero if none
	stopped bool      // while busy: the owner stopped the loop meanwhile
}

// NewLoop returns a stopped loop that runs step on c's timers. step runs one round at now and
// returns when the next is due; it returns ok false when it found nothing held, after calling
// StopLocked under the owner's mutex.
func NewLoop(c Clock, step func(now time.Time) (next time.Time, ok bool)) *Loop {
	return &Loop{clock: c, step: step}
}

// StartLocked reports whether the loop was stopped, and marks it running. The caller holds the
// owner's mutex and has just added a grant; when it returns true, the caller arms the loop
// (WakeAt) once it has released the mutex.
func (lp *Loop) StartLocked() bool {
	if lp.running {
		return false
	}
	lp.running = true
	return true
}

// RunningLocked reports whether the loop is marked running. The caller holds the owner's mutex.
func (lp *Loop) RunningLocked() bool { return lp.running }

// Armed reports when the loop's next round is set to run, if a round is armed.
func (lp *Loop) Armed() (at time.Time, armed bool) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.at, lp.armed
}

// StopLocked stops the loop: no round runs until it is armed again. The caller holds the
// owner's mutex and has found nothing held (the owner's last grant ended, or a step found
// nothing).
func (lp *Loop) StopLocked() {
	lp.running = false
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.busy {
		lp.stopped = true
		lp.wanted = time.Time{}
		return
	}
	if lp.armed {
		lp.t.Stop()
		lp.armed = false
	}
}

// WakeAt asks for a round at at or sooner: the loop's next round moves earlier, never later.
// It never blocks on a round.
func (lp *Loop) WakeAt(at time.Time) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.busy {
		if lp.wanted.IsZero() || at.Before(lp.wanted) {
			lp.wanted = at
		}
		return
	}
	if lp.armed && !at.Before(lp.at) {
		return
	}
	lp.armLocked(at)
}

// armLocked sets the timer to run a round at at. lp.mu is held.
func (lp *Loop) armLocked(at time.Time) {
	d := at.Sub(lp.clock.Now())
	if lp.t == nil {
		lp.t = lp.clock.AfterFunc(d, lp.round)
	} else {
		lp.t.Reset(d)
	}
	lp.armed, lp.at = true, at
}

// round runs one step and arms the timer for the next round: at the time the step returned,
// or sooner if a round was asked for meanwhile. A timer that fires while a round runs (it was
// re-armed as an earlier round's goroutine was starting) leaves its round to be run right after.
func (lp *Loop) round() {
	lp.mu.Lock()
	if lp.busy {
		now := lp.clock.Now()
		if lp.wanted.IsZero() || now.Before(lp.wanted) {
			lp.wanted = now
		}
		lp.mu.Unlock()
		return
	}
	lp.busy, lp.armed, lp.stopped, lp.wanted = true, false, false, time.Time{}
	lp.mu.Unlock()

	next, ok := lp.step(lp.clock.Now())

	lp.mu.Lock()
	defer lp.mu.Unlock()
	lp.busy = false
	switch {
	case !lp.wanted.IsZero(): // asked for meanwhile (by a grant added after the step looked)
		if ok && !lp.stopped && next.Before(lp.wanted) {
			lp.wanted = next
		}
		lp.armLocked(lp.wanted)
	case ok && !lp.stopped:
		lp.armLocked(next)
	}
	lp.wanted = time.Time{}
}
