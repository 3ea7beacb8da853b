package fencelock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
)

// A lease in the caller's transaction (GuardTx, FenceTx) and in the caller's context (Context):
// uses of a Lease that lease.go itself does not make.

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
	return lease.guardTx(ctx, tx)
}

// guardTx is GuardTx on tx, a pgx.Tx or an adapted *sql.Tx (not nil).
func (lease *Lease) guardTx(ctx context.Context, tx db.DBTX) error {
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
	return lease.fenceTx(ctx, tx, resource)
}

// fenceTx is FenceTx on tx, a pgx.Tx or an adapted *sql.Tx (not nil).
func (lease *Lease) fenceTx(ctx context.Context, tx db.DBTX, resource string) error {
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
