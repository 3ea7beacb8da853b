package fencelock

// The trust watch: each lessor keeps its held leases in a second min-heap, by the end of their
// trust window, and one timer set for the earliest. When it fires (on a goroutine of the
// runtime's, whatever the heartbeat, a renewal statement or the pool is doing), it ends every
// lease whose window is over, and moves on every lease that a renewal has extended since it
// was queued: a renewal only grows the window (Lease.renewed), so a lease's place in the heap
// is never later than its window's end, and the heap is corrected lazily, once a window, not
// at every renewal. One timer rather than one per lease: 100,000 runtime timers re-armed every
// heartbeat made the runtime rescan its timer heap (docs/PERFORMANCE.md).

// watchTrustLocked queues lease in the trust watch at the end of its trust window, and moves
// the timer if lease is now the earliest. l.mu must be held.
func (l *Lessor) watchTrustLocked(lease *Lease) {
	lease.mu.Lock()
	until := lease.trustUntil
	lease.mu.Unlock()
	if l.trust.push(lease, until) {
		l.armTrustLocked()
	}
}

// unwatchTrustLocked takes lease out of the trust watch. l.mu must be held.
func (l *Lessor) unwatchTrustLocked(lease *Lease) {
	l.trust.remove(lease)
	if l.trust.Len() == 0 && l.trustTimer != nil {
		l.trustTimer.Stop()
	}
}

// armTrustLocked sets the timer for the earliest trust window end. l.mu must be held.
func (l *Lessor) armTrustLocked() {
	head, ok := l.trust.head()
	if !ok {
		if l.trustTimer != nil {
			l.trustTimer.Stop()
		}
		return
	}
	d := head.at.Sub(l.cfg.clock.Now())
	if l.trustTimer == nil {
		l.trustTimer = l.cfg.clock.AfterFunc(d, l.checkTrust)
		return
	}
	l.trustTimer.Reset(d)
}

// checkTrust ends the leases whose trust window is over, requeues those a renewal extended,
// and sets the timer for the next window end.
func (l *Lessor) checkTrust() {
	now := l.cfg.clock.Now()
	var over []*Lease
	l.mu.Lock()
	for {
		head, ok := l.trust.head()
		if !ok || head.at.After(now) {
			break
		}
		lease := head.lease
		ended := lease.ending.ended()
		lease.mu.Lock()
		until := lease.trustUntil
		lease.mu.Unlock()
		switch {
		case ended:
			l.trust.pop()
		case until.After(now): // renewed since it was queued
			l.trust.rekeyHead(until)
		default:
			l.trust.pop()
			over = append(over, lease)
		}
	}
	l.armTrustLocked()
	l.mu.Unlock()
	for _, lease := range over {
		lease.lost(ErrTrustWindowExpired)
	}
}
