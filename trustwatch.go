package fencelock

import (
	"container/heap"
	"time"
)

// The trust watch: each lessor keeps its held leases in a second min-heap, by the end of their
// trust window, and one timer set for the earliest. When it fires (on a goroutine of the
// runtime's, whatever the heartbeat, a renewal statement or the pool is doing), it ends every
// lease whose window is over, and moves on every lease that a renewal has extended since it
// was queued: a renewal only grows the window (Lease.renewed), so a lease's place in the heap
// is never later than its window's end, and the heap is corrected lazily, once a window, not
// at every renewal. One timer rather than one per lease: 100,000 runtime timers re-armed every
// heartbeat made the runtime rescan its timer heap (docs/PERFORMANCE.md).

// trustQueue is a min-heap of leases by trustKey. Guarded by Lessor.mu.
type trustQueue []*Lease

func (q trustQueue) Len() int           { return len(q) }
func (q trustQueue) Less(i, j int) bool { return q[i].trustKey.Before(q[j].trustKey) }
func (q trustQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].tindex, q[j].tindex = i, j
}
func (q *trustQueue) Push(x any) {
	lease := x.(*Lease)
	lease.tindex = len(*q)
	*q = append(*q, lease)
}
func (q *trustQueue) Pop() any {
	old := *q
	lease := old[len(old)-1]
	old[len(old)-1] = nil
	lease.tindex = -1
	*q = old[:len(old)-1]
	return lease
}

// watchTrustLocked queues lease in the trust watch at the end of its trust window, and moves
// the timer if lease is now the earliest. l.mu must be held.
func (l *Lessor) watchTrustLocked(lease *Lease) {
	lease.mu.Lock()
	lease.trustKey = lease.trustUntil
	lease.mu.Unlock()
	heap.Push(&l.trust, lease)
	if lease.tindex == 0 {
		l.armTrustLocked()
	}
}

// unwatchTrustLocked takes lease out of the trust watch. l.mu must be held.
func (l *Lessor) unwatchTrustLocked(lease *Lease) {
	if lease.tindex >= 0 {
		heap.Remove(&l.trust, lease.tindex)
	}
	if len(l.trust) == 0 && l.trustTimer != nil {
		l.trustTimer.Stop()
	}
}

// armTrustLocked sets the timer for the earliest trust window end. l.mu must be held.
func (l *Lessor) armTrustLocked() {
	if len(l.trust) == 0 {
		if l.trustTimer != nil {
			l.trustTimer.Stop()
		}
		return
	}
	d := time.Until(l.trust[0].trustKey)
	if l.trustTimer == nil {
		l.trustTimer = time.AfterFunc(d, l.checkTrust)
		return
	}
	l.trustTimer.Reset(d)
}

// checkTrust ends the leases whose trust window is over, requeues those a renewal extended,
// and sets the timer for the next window end.
func (l *Lessor) checkTrust() {
	now := time.Now()
	var over []*Lease
	l.mu.Lock()
	for len(l.trust) > 0 && !l.trust[0].trustKey.After(now) {
		lease := l.trust[0]
		lease.mu.Lock()
		until, ended := lease.trustUntil, lease.err != nil
		lease.mu.Unlock()
		switch {
		case ended:
			heap.Pop(&l.trust)
		case until.After(now): // renewed since it was queued
			lease.trustKey = until
			heap.Fix(&l.trust, 0)
		default:
			heap.Pop(&l.trust)
			over = append(over, lease)
		}
	}
	l.armTrustLocked()
	l.mu.Unlock()
	for _, lease := range over {
		lease.lost(ErrTrustWindowExpired)
	}
}
