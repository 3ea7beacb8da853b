package fencelock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The watchdog: while an AdvisoryLocker holds session locks, its loop (loop.go) runs a round
// every interval that probes each held lock's session, all probes at once, each bounded by the
// interval, and ends the locks whose session failed. The loop starts with the first lock held
// and exits when the last one ends, so a locker that holds nothing owns no goroutine.

// watchdogRound is the watchdog loop's step. A round probes every held lock once the probe is
// due (the first one interval after the loop started, each next one an interval after the
// previous round ended), all at once, each for at most one interval; a round woken early
// (a lock ended) only checks whether anything is left.
func (a *AdvisoryLocker) watchdogRound(now time.Time) (next time.Time, ok bool) {
	a.mu.Lock()
	locks := a.grantedLocked()
	switch {
	case len(locks) == 0:
		a.watchdog.stopLocked()
		a.mu.Unlock()
		return now, false
	case now.Before(a.nextProbe):
		next = a.nextProbe
		a.mu.Unlock()
		return next, true
	}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, lk := range locks {
		wg.Go(func() { a.probe(lk) })
	}
	wg.Wait()
	a.mu.Lock()
	a.nextProbe = a.cfg.clock.Now().Add(a.cfg.watchdog)
	next = a.nextProbe
	a.mu.Unlock()
	return next, true
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
