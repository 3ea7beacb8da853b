package fencelock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The watchdog: one goroutine per AdvisoryLocker, alive exactly while the locker holds session
// locks. Every interval it probes each held lock's session, all probes at once, each bounded by
// the interval, and ends the locks whose session failed.

// register records a granted lock and starts the watchdog if needed.
func (a *AdvisoryLocker) register(lk *AdvisoryLock) {
	a.mu.Lock()
	a.held[lk.key] = &heldEntry{name: lk.name, lock: lk}
	start := !a.running
	a.running = true
	a.mu.Unlock()
	if start {
		go a.watch()
	}
}

// unregister forgets a lock that ended; the watchdog exits when none is left.
func (a *AdvisoryLocker) unregister(lk *AdvisoryLock) {
	a.mu.Lock()
	if e, ok := a.held[lk.key]; ok && e.lock == lk {
		delete(a.held, lk.key)
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// heldLocks returns the granted locks, or ok false (and the watchdog marked stopped) when the
// locker holds none. Reservations still being acquired do not keep the watchdog alive:
// register restarts it.
func (a *AdvisoryLocker) heldLocks() (locks []*AdvisoryLock, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.held {
		if e.lock != nil {
			locks = append(locks, e.lock)
		}
	}
	if len(locks) == 0 {
		a.running = false
		return nil, false
	}
	return locks, true
}

func (a *AdvisoryLocker) watch() {
	timer := time.NewTimer(a.watchdog)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-a.wake:
			if _, ok := a.heldLocks(); !ok {
				return
			}
			continue
		}
		locks, ok := a.heldLocks()
		if !ok {
			return
		}
		var wg sync.WaitGroup
		for _, lk := range locks {
			wg.Go(func() { a.probe(lk) })
		}
		wg.Wait()
		timer.Reset(a.watchdog)
	}
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
