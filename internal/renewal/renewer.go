package renewal

import (
	"context"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/timing"
)

const (
	// maxBatch bounds the leases one renewal statement carries, so that one statement stays
	// short (about 4 µs a lease on the server) and several can run side by side.
	maxBatch = 5000
	// maxInFlight bounds the renewal statements in flight, and so the pooled connections the
	// heartbeat takes from the application at once.
	maxInFlight = 2
)

// Slot is a lease's place in a [Renewer]: its index in each heap and whether it is in a
// renewal statement now. The owner embeds one in each lease, made by [NewSlot]; it is guarded
// by the owner's mutex.
type Slot struct {
	renew, trust int // index in the renewal heap and the trust watch; -1: not in it
	inFlight     bool
}

// NewSlot returns the slot of a lease in no heap.
func NewSlot() Slot { return Slot{renew: -1, trust: -1} }

// State is what the schedule reads of a lease, together, under the lease's own lock.
type State struct {
	Times      timing.Times // the lease's durations
	NextRenew  time.Time    // when it is next due (local monotonic); zero without a heartbeat
	TrustUntil time.Time    // the end of its trust window (local monotonic)
}

// Hooks are what a [Renewer] needs of its owner and its leases. Each is required.
type Hooks[T any] struct {
	// Mu is the owner's mutex: it guards the Renewer, every Slot, and the owner's held set.
	Mu sync.Locker
	// Clock is the owner's clock.
	Clock timing.Clock
	// Slot returns the Slot of lease.
	Slot func(lease T) *Slot
	// State returns lease's schedule; it takes the lease's own lock (called with Mu held).
	State func(lease T) State
	// Ended reports whether lease has ended.
	Ended func(lease T) bool
	// Held reports whether lease is in the owner's held set (called with Mu held).
	Held func(lease T) bool
	// Holding reports whether the owner holds any lease (called with Mu held).
	Holding func() bool
	// Renew runs one renewal statement for batch, bounded by ctx, and applies its outcome to
	// each lease (a renewed lease's State moves on). Called on a goroutine of its own, with
	// no lock held.
	Renew func(ctx context.Context, batch []T)
	// Expire ends lease, whose trust window is over. Called with no lock held.
	Expire func(lease T)
}

// Renewer is the heartbeat and the trust watch of one owner's leases (see the package doc).
// Methods named ...Locked are called with the owner's mutex held; the others without. Safe for
// concurrent use under that contract.
type Renewer[T any] struct {
	h          Hooks[T]
	loop       *timing.Loop
	queue      timing.Heap[T] // held leases with a heartbeat, not in flight, by renewal time
	trust      timing.Heap[T] // held leases by the end of their trust window
	trustTimer timing.Timer   // fires at the trust watch's head; nil until the first lease
	inFlight   int            // renewal statements in flight
}

// New returns a Renewer with nothing queued, on h.
func New[T any](h Hooks[T]) *Renewer[T] {
	r := &Renewer[T]{
		h:     h,
		queue: timing.NewHeap(func(lease T) *int { return &h.Slot(lease).renew }),
		trust: timing.NewHeap(func(lease T) *int { return &h.Slot(lease).trust }),
	}
	r.loop = timing.NewLoop(h.Clock, r.round)
	return r
}

// Heartbeat returns the heartbeat's loop, for tests that check it is armed only while
// something is held.
func (r *Renewer[T]) Heartbeat() *timing.Loop { return r.loop }

// AddLocked queues lease, just added to the owner's held set, for the heartbeat (arming the
// loop if it was stopped) and for the trust watch. O(log n). When wake is true, the caller
// calls Wake(at) once it has released the mutex.
func (r *Renewer[T]) AddLocked(lease T) (at time.Time, wake bool) {
	head := r.enqueueLocked(lease)
	r.watchTrustLocked(lease)
	start := r.loop.StartLocked()
	return r.nextRenewalLocked(start || head)
}

// RequeueLocked queues lease for the heartbeat again after a renewal of its holder's own (a
// lease the heartbeat had left to lapse is renewed again). As for AddLocked, the caller calls
// Wake(at) when wake is true.
func (r *Renewer[T]) RequeueLocked(lease T) (at time.Time, wake bool) {
	return r.nextRenewalLocked(r.enqueueLocked(lease))
}

// Wake moves the heartbeat's next round to at or sooner.
func (r *Renewer[T]) Wake(at time.Time) { r.loop.WakeAt(at) }

// ForgetLocked takes lease, just removed from the owner's held set, out of both heaps. O(log n).
// With nothing held and no renewal in flight it stops the loop (a renewal in flight wakes it
// when it returns, and the round then stops it).
func (r *Renewer[T]) ForgetLocked(lease T) {
	r.queue.Remove(lease)
	r.unwatchTrustLocked(lease)
	if !r.h.Holding() && r.inFlight == 0 {
		r.loop.StopLocked()
	}
}

// nextRenewalLocked returns when the heartbeat's earliest queued lease is due, if moved is true
// (the caller changed the queue's head or armed the loop) and the queue is not empty.
func (r *Renewer[T]) nextRenewalLocked(moved bool) (at time.Time, wake bool) {
	if !moved {
		return time.Time{}, false
	}
	_, at, ok := r.queue.Head()
	return at, ok
}

// enqueueLocked puts lease in the renewal heap when it has a heartbeat, is held and is not
// queued or in flight already; it reports whether lease is now the heap's head (the loop's
// next wake-up moved).
func (r *Renewer[T]) enqueueLocked(lease T) bool {
	if r.queue.Queued(lease) || r.h.Slot(lease).inFlight || !r.h.Held(lease) {
		return false
	}
	st := r.h.State(lease)
	if st.Times.Heartbeat <= 0 || r.h.Ended(lease) {
		return false
	}
	return r.queue.Push(lease, st.Times.QueueAt(st.NextRenew))
}

// round is the heartbeat loop's step: it starts a renewal goroutine for each batch of due
// leases and returns when the next round is due. The loop stops only when no lease is held and
// none of the renewal goroutines is left (each wakes it when it returns).
func (r *Renewer[T]) round(now time.Time) (next time.Time, ok bool) {
	batches, next, ok := r.take(now)
	for _, batch := range batches {
		go r.renewBatch(batch)
	}
	return next, ok
}

// take pops the leases due for renewal at now into batches, as many as the in-flight bound
// allows, and returns when the next round is due. ok is false when nothing is held and no
// batch is in flight; the loop is then stopped under the same lock, so AddLocked arms it again.
func (r *Renewer[T]) take(now time.Time) (batches [][]T, next time.Time, ok bool) {
	r.h.Mu.Lock()
	defer r.h.Mu.Unlock()
	if !r.h.Holding() && r.inFlight == 0 {
		r.loop.StopLocked()
		return nil, now, false
	}
	var batch []T
	for r.inFlight < maxInFlight {
		if _, at, ok := r.queue.Head(); !ok || at.After(now) {
			break
		}
		lease := r.queue.Pop()
		st := r.h.State(lease)
		switch st.Times.Verdict(now, st.NextRenew, st.TrustUntil) {
		case timing.RenewLapse: // left to the trust watch, which ends it when its window ends
			continue
		case timing.RenewLater: // renewed meanwhile by its holder: queue it at its new time
			r.enqueueLocked(lease)
			continue
		}
		r.h.Slot(lease).inFlight = true
		batch = append(batch, lease)
		if len(batch) == maxBatch {
			batches = append(batches, batch)
			batch = nil
			r.inFlight++
		}
	}
	if len(batch) > 0 {
		batches = append(batches, batch)
		r.inFlight++
	}
	next = now.Add(time.Hour)
	if _, at, ok := r.queue.Head(); ok && r.inFlight < maxInFlight {
		next = at
	}
	return batches, next, true
}

// renewBatch renews batch in one statement and queues each lease still held for its next
// renewal. Its deadline is the latest trust window end in the batch: past it, no lease of the
// batch can use the answer (a lease whose window ends earlier is ended by the trust watch), and
// a slow statement that would still come back in time is not cut short. (Two statements stuck
// on dead connections hold both in-flight slots until then: TCP and pgx end such connections
// first in practice.)
func (r *Renewer[T]) renewBatch(batch []T) {
	defer func() {
		r.h.Mu.Lock()
		for _, lease := range batch {
			r.h.Slot(lease).inFlight = false
			r.enqueueLocked(lease)
		}
		r.inFlight--
		r.h.Mu.Unlock()
		r.loop.WakeAt(r.h.Clock.Now()) // a slot is free: take the leases due, or stop
	}()
	var deadline time.Time
	for _, lease := range batch {
		if t := r.h.State(lease).TrustUntil; t.After(deadline) {
			deadline = t
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	r.h.Renew(ctx, batch) // outcomes applied to each lease
}
