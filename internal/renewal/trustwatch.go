package renewal

// The trust watch (see the package doc): the heap by the end of each lease's trust window and
// its one timer.

// watchTrustLocked queues lease in the trust watch at the end of its trust window, and moves
// the timer if lease is now the earliest.
func (r *Renewer[T]) watchTrustLocked(lease T) {
	if r.trust.Push(lease, r.h.State(lease).TrustUntil) {
		r.armTrustLocked()
	}
}

// unwatchTrustLocked takes lease out of the trust watch. The timer stays as it is: if it fires
// with nothing over, checkTrust only arms it again for the head, if any.
func (r *Renewer[T]) unwatchTrustLocked(lease T) {
	r.trust.Remove(lease)
}

// armTrustLocked sets the timer for the earliest trust window end, unless it is set for that
// time or earlier already: it then fires first, finds nothing over, and checkTrust arms it for
// the head. So leases granted and released back to back (each one the head for its life) move
// the timer about once a trust window, not twice a lease: a timer reset wakes the runtime's
// network poller, a futex wake-up that cost a grant and release about a tenth of its client CPU
// (issue 23).
func (r *Renewer[T]) armTrustLocked() {
	_, at, ok := r.trust.Head()
	if !ok || (r.trustArmed && !r.trustAt.After(at)) {
		return
	}
	d := at.Sub(r.h.Clock.Now())
	r.trustAt, r.trustArmed = at, true
	if r.trustTimer == nil {
		r.trustTimer = r.h.Clock.AfterFunc(d, r.checkTrust)
		return
	}
	r.trustTimer.Reset(d)
}

// trustChunk bounds the leases the trust watch looks at under the owner's mutex at once: a
// cohort of leases renewed by one statement comes up in the heap together (100,000 at most),
// and the owner's grants and releases wait for that mutex.
const trustChunk = 1024

// checkTrust ends the leases whose trust window is over, requeues those a renewal extended,
// and sets the timer for the next window end. It releases the owner's mutex every trustChunk
// leases.
func (r *Renewer[T]) checkTrust() {
	for {
		now := r.h.Clock.Now()
		var over []T
		more := false
		r.h.Mu.Lock()
		r.trustArmed = false // this is the armed timer's callback: the next arm sets it again
		for n := 0; ; n++ {
			lease, at, ok := r.trust.Head()
			if !ok || at.After(now) {
				break
			}
			if n == trustChunk {
				more = true
				break
			}
			ended := r.h.Ended(lease)
			until := r.h.State(lease).TrustUntil
			switch {
			case ended:
				r.trust.Pop()
			case until.After(now): // renewed since it was queued
				r.trust.RekeyHead(until)
			default:
				r.trust.Pop()
				over = append(over, lease)
			}
		}
		if !more {
			r.armTrustLocked()
		}
		r.h.Mu.Unlock()
		for _, lease := range over {
			r.h.Expire(lease)
		}
		if !more {
			return
		}
	}
}
