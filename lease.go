package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
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

	// Guarded by lessor.mu.
	slots    [2]int // index in the lessor's renewal heap and trust watch (leaseheap.go); -1: not in it
	inFlight bool   // in a renewal statement now
}

func newLease(l *Lessor, name string, token Token, lt leaseTimes, sent, expiresAt time.Time) *Lease {
	lease := &Lease{lessor: l, name: name, token: token, times: lt, ending: newGrantEnd(), start: time.Now(), slots: [2]int{-1, -1}}
	lease.renewed(sent, expiresAt)
	return lease
}

// renewed records a successful grant or renewal sent at sent. The trust window only grows
// (LeaseRenew never moves the expiry back: greatest()), so the larger of two windows holds.
// It does not touch the lessor's trust watch, which finds the extension when the lease's old
// window end comes up (trustwatch.go). It changes nothing once the lease has ended.
func (lease *Lease) renewed(sent, expiresAt time.Time) {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	if lease.ending.ended() {
		return
	}
	if t := lease.times.trustEnd(sent); t.After(lease.trustUntil) {
		lease.trustUntil = t
		lease.nextRenew = lease.times.nextRenewal(sent)
		lease.expiresAt = expiresAt
	}
	lease.lastErr = nil
}

// retryAfter records a renewal that failed at now with err, and schedules the next attempt
// (leaseTimes.retryAt).
func (lease *Lease) retryAfter(now time.Time, err error) {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	if lease.ending.ended() {
		return
	}
	lease.lastErr = err
	if lease.times.heartbeat > 0 {
		lease.nextRenew = lease.times.retryAt(now)
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
func (lease *Lease) TTL() time.Duration { return lease.times.ttl }

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
	head := l.enqueueLocked(lease) // a lease the heartbeat had left to lapse is renewed again
	at, wake := l.nextRenewalLocked(head)
	l.mu.Unlock()
	if wake {
		l.heartbeat.wakeAt(at)
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

// GuardTx checks, inside tx, that this grant is still current on the database: the lease row
// still has this holder and token and has not expired on the database clock. It holds the row
// FOR KEY SHARE until tx ends; a takeover locks the row FOR UPDATE, which conflicts, so no
// takeover can commit before tx does: a write in tx after a successful GuardTx commits before
// any newer grant of the name can. (The lease may still expire on the database clock
// meanwhile; no one can take it over until tx ends.) The heartbeat's renewals of this lease do
// not conflict with that lock and go on while tx is open, so guarded transactions may follow
// each other back to back. One statement.
//
// Use READ COMMITTED (the Postgres default). In a REPEATABLE READ or SERIALIZABLE transaction
// the check reads the row version of tx's snapshot: when the lease was taken over since, it
// fails with a serialization error (SQLSTATE 40001: retry the transaction); when it was only
// renewed since, it passes if that version is unexpired and otherwise reports the lease lost
// (the safe direction: the holder stops).
//
// Errors: [Lease.Err] when the lease has already ended locally (no SQL runs); a
// [*LeaseLostError] when the database no longer has this grant (Done then closes); an
// [*ArgumentError] for a nil tx; otherwise the pgx error, wrapped.
func (lease *Lease) GuardTx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	if err := lease.Err(); err != nil {
		return err
	}
	l := lease.lessor
	_, err := l.q.LeaseGuard(ctx, tx, db.LeaseGuardParams{Name: lease.name, Holder: l.cfg.holder, Token: int64(lease.token)})
	if errors.Is(err, pgx.ErrNoRows) {
		lease.lost(errGoneOnServer)
		return lease.Err()
	}
	if err != nil {
		return wrapPg(fmt.Sprintf("guard lease %q", lease.name), err)
	}
	return nil
}

// FenceTx checks that this grant is still current and advances the high-water mark of
// resource to its token, in one statement inside tx, the caller's transaction: the pattern to
// guard a write with a lease. It refuses a stale holder even when no newer holder has written
// yet (a bare [FenceTx] lets that one through), and a newer holder's fenced write once it has.
// The lease row is held FOR KEY SHARE (as by [Lease.GuardTx]: no takeover can commit before
// tx, and renewals go on) and the fence row locked until tx ends, so fenced writes to resource
// commit in token order. It raises synchronous_commit from off to on for tx. One statement; a
// second only to describe a stale token.
//
// resource is 1 to [MaxNameLength] bytes of UTF-8 without NUL (often the lease name). Errors:
// an [*ArgumentError] before any SQL; [Lease.Err] when the lease has already ended locally (no
// SQL runs); a [*LeaseLostError] when the database no longer has this grant (Done then
// closes); a [*StaleTokenError] when resource has seen a larger token; otherwise the pgx
// error, wrapped. After any error, roll tx back. Use READ COMMITTED, as for [Lease.GuardTx].
// Safe for concurrent use on different transactions.
func (lease *Lease) FenceTx(ctx context.Context, tx pgx.Tx, resource string) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	if err := validateName("resource", resource); err != nil {
		return err
	}
	if err := lease.Err(); err != nil {
		return err
	}
	l := lease.lessor
	row, err := l.q.LeaseFence(ctx, tx, db.LeaseFenceParams{Name: lease.name, Holder: l.cfg.holder, Token: int64(lease.token), Resource: resource})
	if err != nil {
		return wrapPg(fmt.Sprintf("fence %q with lease %q", resource, lease.name), err)
	}
	switch {
	case row.Held == 0:
		lease.lost(errGoneOnServer)
		return lease.Err()
	case row.Advanced == 1:
		return nil
	}
	cur, err := l.q.FenceCurrent(ctx, tx, resource)
	if err != nil {
		return wrapPg(fmt.Sprintf("fence %q: read high-water mark", resource), err)
	}
	l.cfg.common.metrics.stale(mLeaseFenceTx)
	return &StaleTokenError{Resource: resource, Token: lease.token, Current: Token(cur)}
}

// Context returns a copy of parent that is cancelled, with the lease's [Lease.Err] as its cause
// ([context.Cause]), as soon as the lease ends: when its trust window ends without a renewal,
// when a renewal (or a guard or fence) finds it gone, or on [Lease.Release]. The cause is a
// [*LeaseLostError] (matching [ErrLeaseLost]) or [ErrReleased]. It is cancelled with parent's
// cause when parent ends first, and with [context.Canceled] by the returned CancelFunc, which
// the caller must call when done with the context (as for [context.WithCancel]); neither ends
// the lease.
//
// Work that must stop when the lease is lost runs under this context: a statement in flight is
// cancelled on the server, and a loop checking ctx.Done() stops. The context is cancelled by
// the call that ends the lease, before that call returns (the trust watch's timer at the end of
// the trust window, a renewal's verdict, Release, or an [Lease.Err] that finds the window over),
// and at once when the lease has ended already. Writes that must not outlive the lease still
// need a fence ([Lease.FenceTx]): a process paused past its trust window sees the cancellation
// only once its timer has run after it wakes; [Lease.Err], which reads the clock, is the check
// right after a possible pause.
//
// No goroutine watches the lease while it is held: the cancellation is registered with the
// lease's end. Safe for concurrent use; any number of contexts may follow one lease. The idea is
// the session-scoped context of etcd's concurrency package (Session.Done) and client-go's
// leader election (OnStoppedLeading), as one context.
func (lease *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	_ = lease.Err() // ends a lease whose trust window is over: the context is then cancelled at once
	stopLease := lease.ending.afterFunc(func() { cancel(lease.ending.cause()) })
	stopParent := context.AfterFunc(ctx, func() { stopLease() }) // drop the registration once ctx ends
	return ctx, func() {
		stopParent()
		stopLease()
		cancel(context.Canceled)
	}
}
