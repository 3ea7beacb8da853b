package fencelock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/advisory"
	"github.com/fencelock/fencelock/internal/db"
)

// TryLockTx takes the transaction advisory lock of name inside tx, the caller's transaction,
// if it is free, in one statement: exclusive, or shared with [Shared]; of the key name maps to,
// or of the key given by [AtKey] (name then only labels the lock, and may be ""), as for
// [AdvisoryLocker.TryLock]. Postgres releases it when tx ends; there is no unlock. Because it
// needs nothing beyond the transaction, this mode works behind PgBouncer's transaction pooling.
//
// It returns the grant's fencing token when the locker was built with [WithFencingTokens]
// (an int64 > 0, usable with [FenceTx] in the same tx; durable once tx commits), else 0.
// Transaction locks stack in Postgres and are not tracked by the locker (nor counted by
// [WithMaxSessionLocks]): taking one twice in a transaction is allowed and harmless, since
// both levels end with it.
//
// Errors: [ErrNotAcquired] if another session or transaction holds it; an [*ArgumentError]
// for a bad name or option, or a nil tx (no SQL runs); an error wrapping [ErrReadOnly] on a
// hot standby; otherwise pgx's error, wrapped (the transaction is then aborted, as after any
// failed statement). Safe for concurrent use (a pgx.Tx itself is not).
func (a *AdvisoryLocker) TryLockTx(ctx context.Context, tx pgx.Tx, name string, opts ...LockOption) (Token, error) {
	return a.lockTx(ctx, tx, name, opts, false)
}

// LockTx is [AdvisoryLocker.TryLockTx] (same options) that waits in the server's lock queue
// until granted or ctx ends. When ctx ends first, pgx closes tx's connection, which ends the
// transaction and whatever it held; the call returns ctx's error (wrapped) only once the server
// agrees: the backend no longer waits for the key nor holds it (a grant made just as ctx ended
// included), bounded by 5 s. Roll tx back as after any error (a no-op then).
func (a *AdvisoryLocker) LockTx(ctx context.Context, tx pgx.Tx, name string, opts ...LockOption) (Token, error) {
	return a.lockTx(ctx, tx, name, opts, true)
}

func (a *AdvisoryLocker) lockTx(ctx context.Context, tx pgx.Tx, name string, opts []LockOption, wait bool) (Token, error) {
	key, mode, err := a.target(name, opts)
	if err != nil {
		return 0, err
	}
	if tx == nil {
		return 0, argError("tx", "must not be nil")
	}
	var pid uint32 // the pid the connection got at startup: a pooler's own behind one
	if c := tx.Conn(); c != nil {
		pid = c.PgConn().PID()
	}
	return a.lockOnTx(ctx, tx, pid, name, key, mode, wait)
}

// lockOnTx takes the transaction lock on tx, a pgx.Tx or an adapted *sql.Tx (not nil), once
// name and the options are checked. pid is the session's backend pid (0: unknown), for a
// lock whose ctx ends mid-flight: the call then returns only once that backend
// neither waits for nor holds the key (advisory.EndAbandonedWait): the driver closed the
// connection or rolled the transaction back, and the backend may still be queued, unaware, or
// granted the lock just as the client gave up.
func (a *AdvisoryLocker) lockOnTx(ctx context.Context, tx db.DBTX, pid uint32, name string, key AdvisoryKey, mode LockMode, wait bool) (Token, error) {
	row, err := advisory.LockTx(ctx, tx, advisory.Request{
		Name: name, Key: key.k, Shared: mode == Shared, Wait: wait, Tokens: a.cfg.tokens,
	})
	what := fmt.Sprintf("lock %s in transaction", describeLock(name, key))
	switch {
	case err != nil && ctx.Err() != nil:
		err = fmt.Errorf("%s: %w", what, errors.Join(context.Cause(ctx), err))
		if pid != 0 {
			cctx, cancel := detached(ctx, cleanupTimeout)
			if werr := advisory.EndAbandonedWait(cctx, a.pool, pid, key.k); werr != nil {
				err = fmt.Errorf("%w (and %w)", err, werr)
			}
			cancel()
		}
		return 0, err
	case err != nil:
		return 0, wrapPg(what, err)
	case row.InRecovery:
		return 0, fmt.Errorf("%s: %w", what, ErrReadOnly)
	case !row.Granted:
		return 0, ErrNotAcquired
	}
	return Token(row.Token), nil
}
