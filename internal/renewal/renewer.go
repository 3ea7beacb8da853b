package renewal

import (
	"context"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/timing"
)

const (
	// maxBatch bounds the leases one renewal statement carries. Measured on a loaded 2-core
	// machine (fsync off): the server's time per lease is flat from 1,000 leases a statement
	// up (BenchmarkRenewBatch: 8.9 us at 100, 6.6 at 1,000, 9.0 at 10,000), and the client's
	// CPU per held lease did not differ beyond noise between 1,000, 2,000 and 5,000
	// (BenchmarkRenewalSteadyState, TTL 9 s: 2.3 to 2.6, 2.7, 2.1 us a second). A larger batch
	// only holds its rows locked longer (a release of one of them waits for the statement) and
	// the owner's mutex longer while a round takes it. A cohort of 10,000 leases goes in ten
	// full statements.
	maxBatch = 1000
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
	Retrying   bool         // its last renewal failed: it is renewed when due, never early
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
	trustAt    time.Time      // when trustTimer fires, while trustArmed
	trustArmed bool           // trustTimer is set and its callback has not started
	inFlight   int            // renewal statements in flight
	until      time.Time      // the end of the renewal window opened by the last lease due
	aside      []T            // take's scratch: leases popped early that stay queued
}

// batch is one renewal statement's leases, and its deadline: the latest end of their trust
// windows.
type batch[T any] struct {
	leases   []T
	deadline time.Time
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
	for _, b := range batches {
		go r.renewBatch(b)
	}
	return next, ok
}

// take pops the leases to renew at now into batches of at most maxBatch, as many as the
// in-flight bound allows, and returns when the next round is due. ok is false when nothing is
// held and no batch is in flight; the loop is then stopped under the same lock, so AddLocked
// arms it again.
//
// The renewal window: a lease that comes due (its queue time, timing.Times.QueueAt, is
// reached) opens a window of a quarter of its heartbeat, and every lease whose queue time falls
// inside the window is renewed with it, early (by at most a quarter heartbeat, half a
// heartbeat before it is due), in the same statements. Renewed by one statement, those leases
// share its send time and so come due together again: at steady state the held leases fall
// into cohorts at least a window apart, at most three per renewal period (three quarters of
// a heartbeat) when they share a heartbeat, and each round renews hundreds to
// thousands at once instead of the few that came due in the same millisecond. Renewing early
// only moves a trust window on (it is counted from the statement's send time); the window
// never delays a renewal. A lease whose last renewal failed is renewed only when due
// (its retry time), never early. When the in-flight bound stops a round, the window stays
// open, and the next round (when a statement returns) goes on with it.
func (r *Renewer[T]) take(now time.Time) (batches []batch[T], next time.Time, ok bool) {
	r.h.Mu.Lock()
	defer r.h.Mu.Unlock()
	if !r.h.Holding() && r.inFlight == 0 {
		r.loop.StopLocked()
		return nil, now, false
	}
	var cur batch[T]
	for r.inFlight < maxInFlight {
		_, at, ok := r.queue.Head()
		if !ok || (at.After(now) && at.After(r.until)) {
			break
		}
		lease := r.queue.Pop()
		st := r.h.State(lease)
		if st.Times.Verdict(now, st.NextRenew, st.TrustUntil) == timing.RenewLapse {
			continue // left to the trust watch, which ends it when its window ends
		}
		q := st.Times.QueueAt(st.NextRenew) // later than at when its holder renewed it meanwhile
		if q.After(now) {                   // not due: renew it early, inside the window, or queue it
			if st.Retrying || q.After(r.until) || q.After(now.Add(st.Times.Heartbeat/4)) {
				r.aside = append(r.aside, lease)
				continue
			}
		} else if end := now.Add(st.Times.Heartbeat / 4); end.After(r.until) {
			r.until = end // due: it opens the window, or stretches it
		}
		r.h.Slot(lease).inFlight = true
		cur.leases = append(cur.leases, lease)
		if st.TrustUntil.After(cur.deadline) {
			cur.deadline = st.TrustUntil
		}
		if len(cur.leases) == maxBatch {
			batches = append(batches, cur)
			cur = batch[T]{}
			r.inFlight++
		}
	}
	if len(cur.leases) > 0 {
		batches = append(batches, cur)
		r.inFlight++
	}
	for i, lease := range r.aside { // after the loop: queued again inside the window, it would be popped again
		r.enqueueLocked(lease)
		var zero T
		r.aside[i] = zero
	}
	r.aside = r.aside[:0]
	next = now.Add(time.Hour)
	if _, at, ok := r.queue.Head(); ok && r.inFlight < maxInFlight {
		next = at
	}
	return batches, next, true
}

// renewBatch renews b in one statement and queues each lease still held for its next
// renewal. Its deadline is the latest trust window end in the batch: past it, no lease of the
// batch can use the answer (a lease whose window ends earlier is ended by the trust watch), and
// a slow statement that would still come back in time is not cut short. (Two statements stuck
// on dead connections hold both in-flight slots until then: TCP and pgx end such connections
// first in practice.)
func (r *Renewer[T]) renewBatch(b batch[T]) {
	defer func() {
		r.h.Mu.Lock()
		for _, lease := range b.leases {
			r.h.Slot(lease).inFlight = false
			r.enqueueLocked(lease)
		}
		r.inFlight--
		r.h.Mu.Unlock()
		r.loop.WakeAt(r.h.Clock.Now()) // a slot is free: take the leases due, or stop
	}()
	ctx, cancel := context.WithDeadline(context.Background(), b.deadline)
	defer cancel()
	r.h.Renew(ctx, b.leases) // outcomes applied to each lease
}
