package fencelock

import (
	"context"
	"errors"
	"time"

	"github.com/fencelock/fencelock/internal/db"
)

// The heartbeat: the lessor's loop (loop.go), armed exactly while the lessor holds leases (or a
// renewal batch is in flight), its rounds run on a timer, none between rounds. It keeps the held leases with a heartbeat in a min-heap by
// renewal time and, when leases come due, renews them in batches of at most maxRenewBatch, one
// statement each, at most maxRenewInFlight statements at a time, each in a goroutine of its own,
// so a round is never blocked by a statement. Adding or removing a lease costs O(log n) and
// moves the loop's next round only when it changes the earliest renewal; a round renews the k leases due
// at O(k log n), never a scan of all held leases.
//
// The heartbeat does not end leases by their trust window: the lessor's trust watch
// (trustwatch.go) closes Done at the end of each lease's trust window, whatever the heartbeat,
// a statement, or the pool is doing at that moment.

// The loop is armed by the first lease added, its next round moved earlier when a lease
// becomes the earliest renewal, and it is stopped when nothing is held and no renewal is in
// flight. When a lease is due, and what is done with one that is late or about to lapse, is
// the timing core's (schedule.go).

const (
	// maxRenewBatch bounds the leases one renewal statement carries, so that one statement
	// stays short (about 4 µs a lease on the server) and several can run side by side.
	maxRenewBatch = 5000
	// maxRenewInFlight bounds the renewal statements in flight, and so the pooled connections
	// the heartbeat takes from the application at once.
	maxRenewInFlight = 2
)

// add registers a held lease with the lessor, queues it for the heartbeat (arming the loop if
// it was stopped, or moving its next round earlier) and for the trust watch. O(log n).
func (l *Lessor) add(lease *Lease) {
	l.mu.Lock()
	l.active[lease.name] = lease
	lease.added = true
	l.cfg.common.metrics.leaseStarted()
	head := l.enqueueLocked(lease)
	l.watchTrustLocked(lease)
	start := l.heartbeat.startLocked()
	at, wake := l.nextRenewalLocked(start || head)
	l.mu.Unlock()
	if wake {
		l.heartbeat.wakeAt(at)
	}
}

// nextRenewalLocked returns when the heartbeat's earliest queued lease is due, if moved is true
// (the caller changed the queue's head or armed the loop) and the queue is not empty. l.mu
// must be held.
func (l *Lessor) nextRenewalLocked(moved bool) (at time.Time, wake bool) {
	if !moved {
		return time.Time{}, false
	}
	e, ok := l.queue.head()
	return e.at, ok
}

// enqueueLocked puts lease in the renewal heap when it has a heartbeat, is held and is not
// queued or in flight already; it reports whether lease is now the heap's head (the loop's
// next wake-up moved). l.mu must be held.
func (l *Lessor) enqueueLocked(lease *Lease) bool {
	if lease.times.heartbeat <= 0 || l.queue.queued(lease) || lease.inFlight || l.active[lease.name] != lease {
		return false
	}
	if lease.ending.ended() {
		return false
	}
	lease.mu.Lock()
	renewAt := lease.times.queueAt(lease.nextRenew)
	lease.mu.Unlock()
	return l.queue.push(lease, renewAt)
}

// forget unregisters lease: no longer held, no longer renewed. O(log n). With the last lease
// gone and no renewal in flight it stops the loop (a renewal in flight wakes it when it
// returns, and the round then stops it). It reports whether lease was ever given to its caller
// (add), which is when its end is counted (metrics.go).
func (l *Lessor) forget(lease *Lease) (added bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[lease.name] == lease {
		delete(l.active, lease.name)
	}
	l.queue.remove(lease)
	l.unwatchTrustLocked(lease)
	if len(l.active) == 0 && l.inFlight == 0 {
		l.heartbeat.stopLocked()
	}
	l.idleCheckLocked()
	return lease.added
}

// heartbeatRound is the heartbeat loop's step: it starts a renewal goroutine for each batch
// of due leases and returns when the next round is due. The loop stops only when no lease is
// held and none of the renewal goroutines is left (each wakes it when it returns).
func (l *Lessor) heartbeatRound(now time.Time) (next time.Time, ok bool) {
	batches, next, ok := l.take(now)
	for _, batch := range batches {
		go l.renewBatch(batch)
	}
	return next, ok
}

// take pops the leases due for renewal at now into batches, as many as the in-flight bound
// allows, and returns when the next round is due. ok is false when nothing is held and no
// batch is in flight; the loop is then stopped under the same lock, so add arms it again.
func (l *Lessor) take(now time.Time) (batches [][]*Lease, next time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.active) == 0 && l.inFlight == 0 {
		l.heartbeat.stopLocked()
		return nil, now, false
	}
	var batch []*Lease
	for l.inFlight < maxRenewInFlight {
		if e, ok := l.queue.head(); !ok || e.at.After(now) {
			break
		}
		lease := l.queue.pop()
		lease.mu.Lock()
		v := lease.times.verdict(now, lease.nextRenew, lease.trustUntil)
		lease.mu.Unlock()
		switch v {
		case renewLapse: // left to the trust watch, which ends it when its window ends
			continue
		case renewLater: // renewed meanwhile by Lease.Renew: queue it at its new time
			l.enqueueLocked(lease)
			continue
		}
		lease.inFlight = true
		batch = append(batch, lease)
		if len(batch) == maxRenewBatch {
			batches = append(batches, batch)
			batch = nil
			l.inFlight++
		}
	}
	if len(batch) > 0 {
		batches = append(batches, batch)
		l.inFlight++
	}
	next = now.Add(time.Hour)
	if e, ok := l.queue.head(); ok && l.inFlight < maxRenewInFlight {
		next = e.at
	}
	return batches, next, true
}

// renewBatch renews batch in one statement and queues each lease still held for its next
// renewal. Its deadline is the latest trust window end in the batch: past it, no lease of the
// batch can use the answer (a lease whose window ends earlier is ended by the trust watch), and
// a slow statement that would still come back in time is not cut short. (Two statements stuck
// on dead connections hold both in-flight slots until then: TCP and pgx end such connections
// first in practice.)
func (l *Lessor) renewBatch(batch []*Lease) {
	defer func() {
		l.mu.Lock()
		for _, lease := range batch {
			lease.inFlight = false
			l.enqueueLocked(lease)
		}
		l.inFlight--
		l.mu.Unlock()
		l.heartbeat.wakeAt(l.cfg.clock.Now()) // a slot is free: take the leases due, or stop
	}()
	var deadline time.Time
	for _, lease := range batch {
		if t := lease.TrustedUntil(); t.After(deadline) {
			deadline = t
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_, _ = renewLeases(ctx, l, batch) // outcomes applied to each lease; failures logged
}

// renewLeases renews leases (all of lessor l) in one statement and applies the outcome to
// each: renewed, retry soon (the statement failed, or the row is locked by a transaction), or
// lost (the database no longer has the grant). It returns the statement's error, if any, and
// how many of leases came back locked.
func renewLeases(ctx context.Context, l *Lessor, leases []*Lease) (locked int, err error) {
	p := db.LeaseRenewParams{
		Holder: l.cfg.holder,
		Names:  make([]string, len(leases)),
		Tokens: make([]int64, len(leases)),
		TtlsUs: make([]int64, len(leases)),
	}
	for i, lease := range leases {
		p.Names[i] = lease.name
		p.Tokens[i] = int64(lease.token)
		p.TtlsUs[i] = lease.times.ttl.Microseconds()
	}
	clk := l.cfg.clock
	sent := clk.Now()
	rows, err := l.q.LeaseRenew(ctx, l.pool, p)
	if err != nil {
		err = wrapPg("renew leases", err)
		l.cfg.common.logger.Warn("fencelock: renewal failed; retrying until the trust window ends", "leases", len(leases), "error", err)
		now := clk.Now()
		for _, lease := range leases {
			lease.retryAfter(now, err)
		}
		l.cfg.common.metrics.renewed(oFailed, len(leases))
		return 0, err
	}
	type key struct {
		name  string
		token int64
	}
	got := make(map[key]db.LeaseRenewRow, len(rows))
	for _, r := range rows {
		k := key{r.Name, r.Token}
		if prev, ok := got[k]; !ok || !prev.Renewed {
			got[k] = r // renewed = true wins over the snapshot's renewed = false
		}
	}
	var gone, renewed int
	for _, lease := range leases {
		r, ok := got[key{lease.name, int64(lease.token)}]
		switch {
		case !ok:
			if lease.lost(errGoneOnServer) {
				gone++
			}
		case !r.Renewed:
			lease.retryAfter(clk.Now(), errRowLocked)
			locked++
		default:
			lease.renewed(sent, r.ExpiresAt)
			renewed++
		}
	}
	m := l.cfg.common.metrics
	m.renewed(oRenewed, renewed)
	m.renewed(oLocked, locked)
	m.renewed(oLost, gone)
	return locked, nil
}

// errRowLocked is a renewal's verdict on a lease whose row a transaction holds locked (a
// transaction-scoped holder's, or a concurrent renewal of the same lease).
var errRowLocked = errors.New("lease row locked by a transaction")
