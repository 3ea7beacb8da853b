package fencelock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The watchdog: while an AdvisoryLocker holds session locks, a timer fires a round every
// interval that probes each held lock's session, all probes at once, each bounded by the
// interval, and ends the locks whose session failed. No goroutine runs between rounds, so a
// lock held for less than one interval costs no goroutine at all.

// register records a granted lock and arms the watchdog if needed.
func (a *AdvisoryLocker) register(lk *AdvisoryLock) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held[lk.key] = &heldEntry{name: lk.name, lock: lk}
	if a.watch == nil {
		a.watchGen++
		gen := a.watchGen
		a.watch = time.AfterFunc(a.watchdog, func() { a.round(gen) })
	}
}

// unregister forgets a lock that ended, and disarms the watchdog with the last one.
func (a *AdvisoryLocker) unregister(lk *AdvisoryLock) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.held[lk.key]; ok && e.lock == lk {
		delete(a.held, lk.key)
	}
	if a.watch != nil && len(a.grantedLocked()) == 0 {
		a.watch.Stop()
		a.watch = nil
	}
}

// grantedLocked returns the granted locks (not reservations being acquired). a.mu is held.
func (a *AdvisoryLocker) grantedLocked() []*AdvisoryLock {
	var locks []*AdvisoryLock
	for _, e := range a.held {
		if e.lock != nil {
			locks = append(locks, e.lock)
		}
	}
	return locks
}

// round is one watchdog round of arming gen; it re-arms the timer unless the watchdog was
// disarmed (or disarmed and armed again, a new generation) meanwhile.
func (a *AdvisoryLocker) round(gen uint64) {
	a.mu.Lock()
	locks := a.grantedLocked()
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, lk := range locks {
		wg.Go(func() { a.probe(lk) })
	}
	wg.Wait()
	a.mu.Lock()
	if a.watch != nil && a.watchGen == gen {
		a.watch.Reset(a.watchdog)
	}
	a.mu.Unlock()
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
	ctx, cancel := context.WithTimeout(context.Background(), a.watchdog)
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
