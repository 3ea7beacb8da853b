package fencelock

import "time"

// loop is the one idiom for a goroutine that runs while its owner holds something: the
// Lessor's heartbeat and the AdvisoryLocker's watchdog. The owner starts it when it takes its
// first grant, wakes it when a grant changes the loop's next wake-up, and the loop exits when
// its step finds nothing held; a lessor or locker that holds nothing owns no goroutine, and
// needs no Close.
//
// running is guarded by the owner's mutex, the same lock under which the owner adds and
// removes grants: a step that sees nothing held clears it under that lock, so a grant added
// at the same moment finds it cleared and starts a new loop, and is never left unserved.
type loop struct {
	clock   clock
	step    func(now time.Time) (next time.Time, ok bool) // one round; ok false: exit (running cleared)
	running bool                                          // guarded by the owner's mutex
	wake    chan struct{}                                 // cap 1
}

func newLoop(c clock, step func(now time.Time) (time.Time, bool)) *loop {
	return &loop{clock: c, step: step, wake: make(chan struct{}, 1)}
}

// startLocked reports whether the caller, having added a grant under the owner's mutex, must
// start the loop (go lp.run()) once it has released the mutex: true when it was not running.
func (lp *loop) startLocked() bool {
	if lp.running {
		return false
	}
	lp.running = true
	return true
}

// stopLocked marks the loop stopped; its step calls it, under the owner's mutex, when it
// finds nothing held, and then returns ok false.
func (lp *loop) stopLocked() { lp.running = false }

// poke wakes the loop for a round now. It never blocks: one pending wake-up is enough.
func (lp *loop) poke() {
	select {
	case lp.wake <- struct{}{}:
	default:
	}
}

// run calls step, sleeps until the time step returned or a poke, and again, until step says
// nothing is held. Its timer is its own: a loop started while a stopping one is on its way
// out never shares a timer with it (a spare wake-up in the channel costs one idle round).
func (lp *loop) run() {
	var t timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		next, ok := lp.step(lp.clock.Now())
		if !ok {
			return
		}
		if d := next.Sub(lp.clock.Now()); t == nil {
			t = lp.clock.AfterFunc(d, lp.poke)
		} else {
			t.Reset(d)
		}
		<-lp.wake
	}
}
