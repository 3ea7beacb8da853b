package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/renewal"
)

// Lease is one grant of a named lease to a [Lessor]'s holder, with its fencing token. While it
// is held the lessor's heartbeat renews it. The holder trusts it only inside its trust window,
// which ends at (send time of the last successful grant or renewal, on the local monotonic
// clock) + TTL - safety margin; at that moment, or as soon as a renewal finds the lease gone,
// Done closes and Err says why. Acting on a lease whose Done has closed is unsafe; fence every
// write with [FenceTx] or [Lease.GuardTx] all the same, since a process can pause between a
// check and a write.
//
// A lease lost by its trust window is not released on the server: its row expires by its TTL
// (a renewal cut short at the window's end may still have committed and extended it by one
// TTL). Release it explicitly if the name must be free sooner; Release is scoped to this
// grant and harmless if someone else holds the name by then.
//
// A Lease is safe for concurrent use.
type Lease struct {
	lessor *Lessor
	name   string
	token  Token
	times  leaseTimes
	ending grantEnd
	start  time.Time // local, when the grant came back: for the hold time (metrics.go)
	added  bool      // given to the caller (Lessor.add): counted as held; guarded by lessor.mu

	// releaseVia ends the grant on the server, for a grant with a release of its own (a
	// semaphore's permit: semaphore_wait.go); nil: LeaseRelease. Set before the lease is
	// given to its caller.
	releaseVia func(ctx context.Context) (released bool, err error)

	mu         sync.Mutex
	trustUntil time.Time // local monotonic
	nextRenew  time.Time // local monotonic; zero without heartbeat
	expiresAt  time.Time // database clock, as of the last grant or renewal
	lastErr    error     // last renewal failure since the last success

	sched renewal.Slot // its place in the lessor's heartbeat and trust watch; guarded by lessor.mu
}

func newLease(l *Lessor, name string, token Token, lt leaseTimes, sent, expiresAt time.Time) *Lease {
	lease := &Lease{lessor: l, name: name, token: token, times: lt, ending: newGrantEnd(), start: time.Now(), sched: renewal.NewSlot()}
	lease.renewed(sent, expiresAt)
	return lease
}

// renewed records a successful grant or renewal sent at sent. The trust window only grows
// (LeaseRenew never moves the expiry back: greatest()), so the larger of two windows holds.
// It does not touch the lessor's trust watch, which finds the extension when the lease's old
// window end comes up (internal/renewal). It changes nothing once the lease has ended.
func (lease *Lease) renewed(sent, expiresAt time.Time) {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	if lease.ending.ended() {
		return
	}
	if t := lease.times.TrustEnd(sent); t.After(lease.trustUntil) {
		lease.trustUntil = t
		lease.nextRenew = lease.times.NextRenewal(sent)
		lease.expiresAt = expiresAt
	}
	lease.lastErr = nil
}

// retryAfter records a renewal that failed at now with err, and schedules the next attempt
// (timing.Times.RetryAt).
func (lease *Lease) retryAfter(now time.Time, err error) {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	if lease.ending.ended() {
		return
	}
	lease.lastErr = err
	if lease.times.Heartbeat > 0 {
		lease.nextRenew = lease.times.RetryAt(now)
	}
}

// end is the one way a lease ends: it unregisters the lease from its lessor (no more renewals,
// no more trust watch; the lessor may grant the name again), then closes Done with err, once;
// later calls change nothing. It reports whether this call ended the lease.
func (lease *Lease) end(err error) bool {
	added := lease.lessor.forget(lease)
	lease.mu.Lock() // so that a renewal's outcome is applied wholly before the end or not at all
	defer lease.mu.Unlock()
	return lease.ending.finishWith(err, func() {
		if added { // recorded before Done closes: a caller that saw Done closed sees it counted
			lease.lessor.cfg.common.metrics.leaseEnded(lease.start, err)
		}
	})
}

// lost ends the lease as lost with cause, and logs it. A trust-window loss carries the last
// renewal error, if any. It reports whether this call ended the lease.
func (lease *Lease) lost(cause error) bool {
	if cause == ErrTrustWindowExpired {
		lease.mu.Lock()
		if lease.lastErr != nil {
			cause = fmt.Errorf("%w; last renewal error: %w", ErrTrustWindowExpired, lease.lastErr)
		}
		lease.mu.Unlock()
	}
	if !lease.end(&LeaseLostError{Name: lease.name, Token: lease.token, Cause: cause}) {
		return false
	}
	lease.lessor.cfg.common.logger.Error("fencelock: lease lost", "lease", lease.name, "token", int64(lease.token), "cause", cause)
	return true
}

// Name returns the lease name.
func (lease *Lease) Name() string { return lease.name }

// Token returns the fencing token of this grant, an int64 > 0 larger than that of every
// earlier grant of the name. Renewals keep it.
func (lease *Lease) Token() Token { return lease.token }

// Holder returns the holder id of the lessor that holds the lease.
func (lease *Lease) Holder() string { return lease.lessor.cfg.holder }

// TTL returns the lease's TTL, as passed to the acquire call.
func (lease *Lease) TTL() time.Duration { return lease.times.TTL }

// ExpiresAt returns the lease's expiry on the database clock as of its last successful grant
// or renewal. Compare it only with database time; the holder's own deadline is
// [Lease.TrustedUntil].
func (lease *Lease) ExpiresAt() time.Time {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	return lease.expiresAt
}

// TrustedUntil returns the end of the trust window on the local clock (it carries a monotonic
// reading): the send time of the last successful grant or renewal + TTL - safety margin.
func (lease *Lease) TrustedUntil() time.Time {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	return lease.trustUntil
}

// Done returns a channel that is closed when the lease ends: released, lost on the server, or
// past its trust window. It never reopens.
func (lease *Lease) Done() <-chan struct{} { return lease.ending.done }

// Err returns nil while the lease is held and its trust window is open. After Done has closed
// it returns [ErrReleased] if the holder released it, or a [*LeaseLostError] (matching
// [ErrLeaseLost]) whose Cause is [ErrTrustWindowExpired] or the server's verdict.
//
// Err reads the local monotonic clock itself: past the end of the trust window it ends the
// lease on the spot (closing Done) rather than wait for the trust watch's timer to fire, so
// a process that was paused past its TTL sees the loss at its first check after waking.
func (lease *Lease) Err() error {
	if err := lease.ending.cause(); err != nil {
		return err
	}
	if !lease.lessor.cfg.clock.Now().Before(lease.TrustedUntil()) {
		lease.lost(ErrTrustWindowExpired)
	}
	return lease.ending.cause()
}

// Renew extends the lease by its TTL now, in one statement, and restarts its trust window.
// The heartbeat does this on its own; call Renew for leases taken with [WithoutHeartbeat].
//
// Errors: Err() when the lease has already ended (no SQL runs); a [*LeaseLostError] when the
// database no longer has this grant (Done then closes); an error saying the row is locked by a
// transaction (a concurrent renewal of this lease by the heartbeat): try again;
// otherwise the pgx error, wrapped, and the lease stays held until its trust window ends.
func (lease *Lease) Renew(ctx context.Context) error {
	if err := lease.Err(); err != nil {
		return err
	}
	locked, err := renewLeases(ctx, lease.lessor, []*Lease{lease})
	if err != nil {
		return fmt.Errorf("renew lease %q: %w", lease.name, err)
	}
	if err := lease.Err(); err != nil {
		return err
	}
	if locked > 0 {
		return fmt.Errorf("renew lease %q: %w; try again", lease.name, errRowLocked)
	}
	l := lease.lessor
	l.mu.Lock()
	at, wake := l.renewer.RequeueLocked(lease) // a lease the heartbeat had left to lapse is renewed again
	l.mu.Unlock()
	if wake {
		l.renewer.Wake(at)
	}
	return nil
}

// Release closes Done at once (Err then reports [ErrReleased], unless the lease had already
// been lost), then ends the lease on the server, scoped to (name, holder, token), so it never
// frees a newer grant. The heartbeat stops renewing it even when the statement fails, so a
// failed release leaves the lease to expire within its TTL. One statement.
//
// When someone waits for the name, the same statement hands the lease to the head of the
// queue (a new grant, with a fresh token, durable when the statement commits) and wakes that
// waiter alone; with a guarded transaction of this lease still open it releases without a
// hand-off instead (the hand-off would have to wait for that transaction) and wakes the head
// to take the lease itself. When nobody waits, the release commits without waiting for its WAL
// flush (synchronous_commit off): a release lost in a crash leaves the name held until the
// grant's TTL ends, never longer, which is safe.
//
// Release runs even when ctx has ended (a request cancelled, a deadline passed, a shutdown
// under way): it keeps ctx's values but not its cancellation or deadline, and is bounded by
// 5 s of its own instead, the wait for this lessor's other calls on the name included. Past
// that bound the statement is cancelled and the lease expires within its TTL. So a deferred
// Release with the context of the work it guarded frees the name at once; it never leaves it
// held for a TTL because that context has ended.
//
// Errors: an error wrapping [ErrNotHeld] when the grant had already expired or been taken over
// (nothing changed); otherwise the pgx error, wrapped (context.DeadlineExceeded when the 5 s
// bound passed).
func (lease *Lease) Release(ctx context.Context) error {
	rctx, stop := detached(ctx, cleanupTimeout)
	defer stop()
	return lease.release(rctx)
}

// release is Release on ctx as given: for a caller that has detached ctx from its own
// caller's cancellation and bounded it already, one bound for several statements (a set's
// release, a resign).
func (lease *Lease) release(ctx context.Context) error {
	l := lease.lessor
	// Marked as being released by its holder, so that leaving a queue does not hand it on
	// meanwhile (releaseUnclaimedLocked) and turn this release into ErrNotHeld.
	l.mu.Lock()
	l.releasing[lease.token]++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.releasing[lease.token]--; l.releasing[lease.token] <= 0 {
			delete(l.releasing, lease.token)
		}
		l.mu.Unlock()
	}()
	// Stop trusting the lease before the statement: it may hang (a blackholed connection)
	// past the trust window.
	lease.end(ErrReleased)
	// Inside the name's gate: no attempt of this lessor on the name runs meanwhile, so none
	// can take this grant for its own while the release is in flight. When the gate is not
	// free within the bound, ctx has ended and the statement is not sent either.
	if exit, err := l.enter(ctx, lease.name); err == nil {
		defer exit()
	}
	var released bool
	var err error
	if lease.releaseVia != nil {
		released, err = lease.releaseVia(ctx)
	} else {
		released, err = leaseRelease(ctx, l.q, l.pool, l.cfg.holder, lease.name, lease.token)
	}
	if err != nil {
		return err
	}
	if !released {
		return fmt.Errorf("release lease %q (token %d): %w", lease.name, lease.token, ErrNotHeld)
	}
	return nil
}

// state is what the lessor's heartbeat and trust watch read of the lease (internal/renewal).
func (lease *Lease) state() renewal.State {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	return renewal.State{Times: lease.times, NextRenew: lease.nextRenew, TrustUntil: lease.trustUntil, Retrying: lease.lastErr != nil}
}

// newRenewer returns the heartbeat and the trust watch of l's held leases: renewals by
// renewLeases, the end of a trust window by Lease.lost. They share l.mu, under which add and
// forget change the held set.
func newRenewer(l *Lessor) *renewal.Renewer[*Lease] {
	return renewal.New(renewal.Hooks[*Lease]{
		Mu:      &l.mu,
		Clock:   l.cfg.clock,
		Slot:    func(lease *Lease) *renewal.Slot { return &lease.sched },
		State:   (*Lease).state,
		Ended:   func(lease *Lease) bool { return lease.ending.ended() },
		Held:    func(lease *Lease) bool { return l.active[lease.name] == lease },
		Holding: func() bool { return len(l.active) > 0 },
		Renew: func(ctx context.Context, batch []*Lease) {
			_, _ = renewLeases(ctx, l, batch) // outcomes applied to each lease; failures logged
		},
		Expire: func(lease *Lease) { lease.lost(ErrTrustWindowExpired) },
	})
}

// add registers a held lease with the lessor, queues it for the heartbeat (arming its loop if
// it was stopped, or moving its next round earlier) and for the trust watch. O(log n).
func (l *Lessor) add(lease *Lease) {
	l.mu.Lock()
	l.active[lease.name] = lease
	lease.added = true
	l.cfg.common.metrics.leaseStarted()
	at, wake := l.renewer.AddLocked(lease)
	l.mu.Unlock()
	if wake {
		l.renewer.Wake(at)
	}
}

// forget unregisters lease: no longer held, no longer renewed. O(log n). With the last lease
// gone and no renewal in flight it stops the heartbeat. It reports whether lease was ever given
// to its caller (add), which is when its end is counted (metrics.go).
func (l *Lessor) forget(lease *Lease) (added bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[lease.name] == lease {
		delete(l.active, lease.name)
	}
	l.renewer.ForgetLocked(lease)
	l.idleCheckLocked()
	return lease.added
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
		p.TtlsUs[i] = lease.times.TTL.Microseconds()
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
	// Each row names its lease by its place in the arrays (from 1); renewed = true wins over
	// the snapshot's renewed = false.
	const (
		gone       uint8 = iota // no row: the database no longer has the grant
		rowLocked               // only renewed = false: its row was locked
		wasRenewed              // a renewed = true row
	)
	type outcome struct {
		state     uint8
		expiresAt time.Time
	}
	got := make([]outcome, len(leases))
	for _, r := range rows {
		i := int(r.Idx) - 1
		if i < 0 || i >= len(got) || got[i].state == wasRenewed {
			continue
		}
		if r.Renewed {
			got[i] = outcome{wasRenewed, r.ExpiresAt}
		} else {
			got[i].state = rowLocked
		}
	}
	var nGone, nLocked, nRenewed int
	for i, lease := range leases {
		switch got[i].state {
		case gone:
			if lease.lost(errGoneOnServer) {
				nGone++
			}
		case rowLocked:
			lease.retryAfter(clk.Now(), errRowLocked)
			nLocked++
		default:
			lease.renewed(sent, got[i].expiresAt)
			nRenewed++
		}
	}
	m := l.cfg.common.metrics
	m.renewed(oRenewed, nRenewed)
	m.renewed(oLocked, nLocked)
	m.renewed(oLost, nGone)
	return nLocked, nil
}

// errRowLocked is a renewal's verdict on a lease whose row a transaction holds locked (a
// transaction-scoped holder's, or a concurrent renewal of the same lease).
var errRowLocked = errors.New("lease row locked by a transaction")
