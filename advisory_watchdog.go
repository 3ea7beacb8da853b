package fencelock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The watchdog: while an AdvisoryLocker holds session locks, its loop (timing.Loop) runs a round
// every interval that probes each held lock's session, all probes at once, each bounded by the
// interval, and ends the locks whose session failed. The loop is armed with the first lock
// held and stopped when the last one ends; between rounds no goroutine runs, so a lock held
// for less than one interval costs none.

// watchdogRound is the watchdog loop's step: it probes every held lock, all at once, each for
// at most one interval, and asks for the next round an interval after this one ended. The
// first round runs one interval after the loop was armed (register).
func (a *AdvisoryLocker) watchdogRound(now time.Time) (next time.Time, ok bool) {
	a.mu.Lock()
	locks := a.grantedLocked()
	if len(locks) == 0 {
		a.watchdog.StopLocked()
		a.mu.Unlock()
		return now, false
	}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, lk := range locks {
		wg.Go(func() { a.probe(lk) })
	}
	wg.Wait()
	return a.cfg.clock.Now().Add(a.cfg.watchdog), true
}

// probe checks one lock's session; a failure ends the lock. A probe that finds the connection
// busy (Unlock running) skips this round.
func (a *AdvisoryLocker) probe(lk *AdvisoryLock) {
	if !lk.connMu.TryLock() {
		return
	}
	conn := lk.conn
	if conn == nil {
		lk.connMu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.watchdog)
	pid, err := a.q.AdvisorySessionCheck(ctx, conn)
	cancel()
	lk.connMu.Unlock()
	switch {
	case err != nil:
		lk.lost(fmt.Errorf("session probe: %w", err))
	case uint32(pid) != lk.pid:
		lk.lost(fmt.Errorf("%w (pid %d, was %d): %w", errPIDChanged, pid, lk.pid, ErrConnectionPooler))
	}
}
