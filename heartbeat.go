package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/db"
)

// The heartbeat: one goroutine per Lessor, alive exactly while the lessor holds leases. It
// renews every lease that is due (or nearly due) in one statement, and closes the Done channel
// of each lease whose trust window ends first.

// lapseSlack: a lease whose trust window ends sooner than this (or an eighth of its heartbeat)
// is left out of renewal batches; its window ends before a renewal could come back.
const lapseSlack = 5 * time.Millisecond

// add registers a held lease with the heartbeat, starting it if needed.
func (l *Lessor) add(lease *Lease) {
	l.mu.Lock()
	l.active[lease.name] = lease
	start := !l.running
	l.running = true
	l.mu.Unlock()
	if start {
		go l.run()
	} else {
		l.poke()
	}
}

// remove unregisters a lease; the heartbeat exits when none is left.
func (l *Lessor) remove(lease *Lease) {
	l.mu.Lock()
	if l.active[lease.name] == lease {
		delete(l.active, lease.name)
	}
	l.mu.Unlock()
	l.poke()
}

func (l *Lessor) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is the heartbeat loop. It owns no lease: it stops when active is empty.
func (l *Lessor) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		due, expired, next, ok := l.scan(now)
		for _, lease := range expired {
			lease.mu.Lock()
			cause := ErrTrustWindowExpired
			if lease.lastErr != nil {
				cause = fmt.Errorf("%w; last renewal error: %w", ErrTrustWindowExpired, lease.lastErr)
			}
			lease.mu.Unlock()
			lease.lost(cause)
		}
		if !ok {
			return
		}
		if len(due) > 0 {
			l.renewBatch(due)
			continue
		}
		timer.Reset(next.Sub(now))
		select {
		case <-timer.C:
		case <-l.wake:
		}
	}
}

// scan sorts the active leases at now into those due for renewal and those past their trust
// window (removed from active), and returns when the loop must next wake. ok is false when no
// lease is left; running is then cleared under the same lock, so add restarts the loop.
func (l *Lessor) scan(now time.Time) (due, expired []*Lease, next time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next = now.Add(time.Hour)
	for name, lease := range l.active {
		lease.mu.Lock()
		switch {
		case !now.Before(lease.trustUntil):
			expired = append(expired, lease)
			delete(l.active, name)
		case lease.times.heartbeat > 0 && !now.Before(lease.nextRenew.Add(-lease.times.heartbeat/4)) &&
			lease.trustUntil.Sub(now) > max(lapseSlack, lease.times.heartbeat/8):
			// Due, or due within a quarter heartbeat, and not about to lapse (a lease that
			// is would cut the batch's deadline short for all): renew it with this batch.
			due = append(due, lease)
		default:
			if lease.times.heartbeat > 0 && lease.nextRenew.After(now) && lease.nextRenew.Before(next) {
				next = lease.nextRenew
			}
			if lease.trustUntil.Before(next) {
				next = lease.trustUntil
			}
		}
		lease.mu.Unlock()
	}
	if len(l.active) == 0 {
		// Stop now, expired or not: run closes the expired leases' Done and returns, and add
		// starts a new loop for the next lease.
		l.running = false
		return nil, expired, next, false
	}
	return due, expired, next, true
}

// renewBatch renews due leases in one statement. Its deadline is the earliest trust window
// end among them: the loop runs the batch synchronously, and must be back in scan to close
// that lease's Done on time. (scan leaves leases about to lapse out of the batch, so one of
// them cannot cut the batch short for the healthy ones.)
func (l *Lessor) renewBatch(due []*Lease) {
	deadline := due[0].TrustedUntil()
	p := db.LeaseRenewParams{Holder: l.holder}
	for _, lease := range due {
		if t := lease.TrustedUntil(); t.Before(deadline) {
			deadline = t
		}
		p.Names = append(p.Names, lease.name)
		p.Tokens = append(p.Tokens, int64(lease.token))
		p.TtlsUs = append(p.TtlsUs, lease.times.ttl.Microseconds())
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	sent := time.Now()
	rows, err := l.q.LeaseRenew(ctx, l.pool, p)
	if err != nil {
		err = wrapPg("renew leases", err)
		l.log.Warn("fencelock: renewal failed; retrying until the trust window ends", "leases", len(due), "error", err)
		for _, lease := range due {
			lease.retryAfter(time.Now(), err)
		}
		return
	}
	type key struct {
		name  string
		token int64
	}
	got := make(map[key]db.LeaseRenewRow, len(rows))
	for _, r := range rows {
		got[key{r.Name, r.Token}] = r
	}
	for _, lease := range due {
		r, ok := got[key{lease.name, int64(lease.token)}]
		switch {
		case !ok:
			l.mu.Lock()
			active := l.active[lease.name] == lease
			if active {
				delete(l.active, lease.name)
			}
			l.mu.Unlock()
			if active { // not released meanwhile
				lease.lost(errGoneOnServer)
			}
		case !r.Renewed:
			lease.retryAfter(time.Now(), errors.New("lease row locked by a transaction"))
		default:
			lease.renewed(sent, r.ExpiresAt)
		}
	}
}

// retryAfter schedules another renewal attempt a quarter heartbeat (at least 5ms) after a
// failure at now. (scan renews a quarter heartbeat early, hence the half here.)
func (lease *Lease) retryAfter(now time.Time, err error) {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	lease.lastErr = err
	lease.nextRenew = now.Add(max(lease.times.heartbeat/2, lease.times.heartbeat/4+5*time.Millisecond))
}
