package fencelock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/advisory"
)

// AdvisoryLock is a session advisory lock held on a connection of its own. It is safe for
// concurrent use.
type AdvisoryLock struct {
	locker  lockOwner
	common  *commonConfig // the locker's: where a loss is counted and logged
	name    string
	key     AdvisoryKey
	mode    LockMode
	token   Token
	pid     uint32
	prevApp string // the session's application_name at the grant, put back on unlock once labelled
	ending  grantEnd

	connMu   sync.Mutex    // serialises use of conn: the watchdog's probe, Unlock
	conn     *pgxpool.Conn // nil once unlocked or lost
	labelled bool          // the watchdog's first probe named the session after the lock; guarded by connMu
}

// lockOwner is what a lock needs of its locker ([AdvisoryLocker]): to leave its held set when
// the lock ends.
type lockOwner interface {
	unregister(lk *AdvisoryLock)
}

// Name returns the lock's name, or "" for a lock taken by key ([AtKey]) without one.
func (lk *AdvisoryLock) Name() string { return lk.name }

// Key returns the advisory key held.
func (lk *AdvisoryLock) Key() AdvisoryKey { return lk.key }

// Mode returns [Exclusive] or [Shared].
func (lk *AdvisoryLock) Mode() LockMode { return lk.mode }

// Token returns the grant's fencing token (an int64 > 0) when the locker was built with
// [WithFencingTokens], else 0.
func (lk *AdvisoryLock) Token() Token { return lk.token }

// BackendPID returns the pid of the server session that holds the lock (pg_locks.pid).
func (lk *AdvisoryLock) BackendPID() uint32 { return lk.pid }

// Done returns a channel closed when the lock ends: unlocked, or its session lost.
func (lk *AdvisoryLock) Done() <-chan struct{} { return lk.ending.done }

// Err returns nil while the lock is held; after Done has closed, [ErrUnlocked] or a
// [*SessionLostError] (matching [ErrLockLost]).
func (lk *AdvisoryLock) Err() error { return lk.ending.cause() }

// end is the one way a lock ends. The call that takes the lock's connection gives the session
// up with settle (the unlock statement, or closing the connection) and takes the lock out of
// its locker's held set, both under connMu, so that a call waiting on connMu returns only
// once both are done. Done closes with cause at one of two points, as the caller says:
//   - doneFirst (Unlock): before anything else, since the statement may hang and the holder must
//     stop trusting the lock it gives up at once. A call that did not end the lock waits until
//     the one that did has settled the session, and touches nothing.
//   - otherwise (a lost session): last, once the session is closed and the locker has forgotten
//     the lock, so that when Done closes nothing is held and the locker may take the name
//     again. A call that finds the connection already taken leaves Done to the call that took it.
//
// It reports whether this call closed Done and whether it settled the session.
func (lk *AdvisoryLock) end(cause error, doneFirst bool, settle func(conn *pgxpool.Conn)) (ended, settled bool) {
	if doneFirst && !lk.ending.finish(cause) {
		lk.connMu.Lock() // wait for the call that ended it to settle the session
		lk.connMu.Unlock()
		return false, false
	}
	// The locker forgets the lock before connMu is released: a call that waited on connMu
	// returns only once nothing of the lock is left.
	lk.connMu.Lock()
	conn := lk.conn
	lk.conn = nil
	if conn != nil {
		settle(conn)
		lk.locker.unregister(lk)
	}
	lk.connMu.Unlock()
	if conn == nil {
		return doneFirst, false
	}
	if doneFirst {
		return true, true
	}
	return lk.ending.finishWith(cause, func() {
		if _, ok := cause.(*SessionLostError); ok { // counted before Done closes
			lk.common.metrics.sessionLost()
		}
	}), true
}

// Unlock releases the lock and puts the connection back in the pool, in one statement; when
// the watchdog labelled the session (a lock held past its first probe), the statement also
// puts back the application_name the session had at the grant. When
// the release cannot be confirmed (the statement failed, or the session did not hold the lock)
// the connection is closed instead, which ends the session and any lock it held. Done closes
// first, before the statement is sent (Err then reports [ErrUnlocked]): the statement may hang
// on a broken network, and the holder must stop trusting the lock it is giving up at once.
//
// Unlock runs even when ctx has ended: the statement keeps ctx's values but not its
// cancellation or deadline, and is bounded by 5 s of its own, so a deferred Unlock with an
// ended context unlocks and returns the connection to the pool rather than closing it. Past
// the bound the statement is cancelled and the connection closed, which ends the session and
// the lock too.
//
// Errors: an error wrapping [ErrNotHeld] if the lock had already ended (Err says why) or the
// session no longer held it; otherwise pgx's error, wrapped (the session was closed, so
// nothing is held).
func (lk *AdvisoryLock) Unlock(ctx context.Context) error {
	what := func() string { return "unlock " + describeLock(lk.name, lk.key) } // for errors only
	var err error
	ended, settled := lk.end(ErrUnlocked, true, func(conn *pgxpool.Conn) {
		released, uerr := unlockSession(ctx, conn, lk.key, lk.mode, lk.labelled, lk.prevApp)
		switch {
		case uerr != nil:
			destroySession(ctx, conn, false)
			err = wrapPg(what(), uerr)
		case !released:
			destroySession(ctx, conn, false)
			err = fmt.Errorf("%s: %w: the session did not hold it; connection closed", what(), ErrNotHeld)
		default:
			conn.Release()
		}
	})
	switch {
	case settled:
		return err
	case !ended:
		return fmt.Errorf("%s: %w: %w", what(), ErrNotHeld, lk.Err())
	}
	// Ended here, but the watchdog had taken the session, which it closes: nothing is held.
	return fmt.Errorf("%s: %w: its session was lost", what(), ErrNotHeld)
}

// unlockSession runs the unlock statement on conn with ctx's values but not its cancellation
// or deadline, bounded by cleanupTimeout as a deadline on the connection's socket: the way pgx
// itself ends a statement whose context ends (its default ContextWatcherHandler sets the
// socket's deadline), without a context of its own to allocate and watch for every unlock
// (issue 23). Past the deadline the read fails and pgx closes the connection as it does then
// (a cancel request, Terminate, the socket closed once the server has closed its end or 15 s
// have passed), which ends the session and its lock; the caller destroys the session. On
// success the deadline is cleared before the connection goes back to the pool. labelled says
// whether the watchdog labelled the session, whose application_name prevApp then is to put
// back; an unlabelled lock takes the bare unlock statement and leaves application_name alone.
// The caller holds connMu.
func unlockSession(ctx context.Context, conn *pgxpool.Conn, key AdvisoryKey, mode LockMode, labelled bool, prevApp string) (released bool, err error) {
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	nc := conn.Conn().PgConn().Conn()
	if err := nc.SetDeadline(time.Now().Add(cleanupTimeout)); err != nil {
		return false, err
	}
	released, err = advisory.UnlockSession(ctx, conn, key.k, mode == Shared, labelled, prevApp)
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	return released, err
}

// lost ends a lock whose session failed the watchdog's probe, closing its connection; Done
// closes once nothing is held.
func (lk *AdvisoryLock) lost(cause error) {
	ended, _ := lk.end(&SessionLostError{Key: lk.key, Name: lk.name, Cause: cause}, false, func(conn *pgxpool.Conn) {
		destroySession(context.Background(), conn, false)
	})
	if ended {
		lk.common.logger.Error("fencelock: advisory lock lost", "lock", lk.name, "key", lk.key.String(), "cause", cause)
	}
}
