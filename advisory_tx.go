package fencelock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
)

// TryLockTx takes the exclusive transaction advisory lock of name inside tx, the caller's
// transaction, if it is free, in one statement. Postgres releases it when tx ends; there is no
// unlock. Because it needs nothing beyond the transaction, this mode works behind PgBouncer's
// transaction pooling.
//
// It returns the grant's fencing token when the locker was built with [WithFencingTokens]
// (an int64 > 0, usable with [FenceTx] in the same tx; durable once tx commits), else 0.
// Transaction locks stack in Postgres and are not tracked by the locker: taking one twice in a
// transaction is allowed and harmless, since both levels end with it.
//
// Errors: [ErrNotAcquired] if another session or transaction holds it; an [*ArgumentError]
// for a bad name or a nil tx (no SQL runs); an error wrapping [ErrReadOnly] on a hot standby;
// otherwise pgx's error, wrapped (the transaction is then aborted, as after any failed
// statement).
func (a *AdvisoryLocker) TryLockTx(ctx context.Context, tx pgx.Tx, name string) (Token, error) {
	return a.lockTxName(ctx, tx, name, Exclusive, false)
}

// LockTx is [AdvisoryLocker.TryLockTx] that waits in the server's lock queue until granted or
// ctx ends. When ctx ends first the statement is cancelled and tx is aborted: roll it back,
// which releases anything it held.
func (a *AdvisoryLocker) LockTx(ctx context.Context, tx pgx.Tx, name string) (Token, error) {
	return a.lockTxName(ctx, tx, name, Exclusive, true)
}

// TryLockSharedTx is [AdvisoryLocker.TryLockTx] in [Shared] mode.
func (a *AdvisoryLocker) TryLockSharedTx(ctx context.Context, tx pgx.Tx, name string) (Token, error) {
	return a.lockTxName(ctx, tx, name, Shared, false)
}

// LockSharedTx is [AdvisoryLocker.LockTx] in [Shared] mode.
func (a *AdvisoryLocker) LockSharedTx(ctx context.Context, tx pgx.Tx, name string) (Token, error) {
	return a.lockTxName(ctx, tx, name, Shared, true)
}

// TryLockKeyTx is [AdvisoryLocker.TryLockTx] for an explicit key, in mode.
func (a *AdvisoryLocker) TryLockKeyTx(ctx context.Context, tx pgx.Tx, key AdvisoryKey, mode LockMode) (Token, error) {
	return a.lockTx(ctx, tx, "", key, mode, false)
}

// LockKeyTx is [AdvisoryLocker.LockTx] for an explicit key, in mode.
func (a *AdvisoryLocker) LockKeyTx(ctx context.Context, tx pgx.Tx, key AdvisoryKey, mode LockMode) (Token, error) {
	return a.lockTx(ctx, tx, "", key, mode, true)
}

func (a *AdvisoryLocker) lockTxName(ctx context.Context, tx pgx.Tx, name string, mode LockMode, wait bool) (Token, error) {
	key, err := a.Key(name)
	if err != nil {
		return 0, err
	}
	return a.lockTx(ctx, tx, name, key, mode, wait)
}

func (a *AdvisoryLocker) lockTx(ctx context.Context, tx pgx.Tx, name string, key AdvisoryKey, mode LockMode, wait bool) (Token, error) {
	if tx == nil {
		return 0, argError("tx", "must not be nil")
	}
	if mode != Exclusive && mode != Shared {
		return 0, argError("mode", "is %d; want Exclusive or Shared", int(mode))
	}
	row, err := a.q.AdvisoryLockTx(ctx, tx, db.AdvisoryLockTxParams{
		Tokens: a.cfg.tokens,
		Wait:   wait,
		Pair:   key.pair, K1: key.k1, K2: key.k2, Key: key.key,
		Shared: mode == Shared,
	})
	what := fmt.Sprintf("lock %s in transaction", describeLock(name, key))
	switch {
	case err != nil && ctx.Err() != nil:
		return 0, fmt.Errorf("%s: %w", what, errors.Join(context.Cause(ctx), err))
	case err != nil:
		return 0, wrapPg(what, err)
	case row.InRecovery:
		return 0, fmt.Errorf("%s: %w", what, ErrReadOnly)
	case !row.Granted:
		return 0, ErrNotAcquired
	}
	return Token(row.Token), nil
}
