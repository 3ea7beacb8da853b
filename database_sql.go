package fencelock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/sqltx"
)

// The database/sql forms of the calls that take the caller's transaction: each ...SQLTx call
// is its pgx twin (the name without SQL) on a *sql.Tx, and sends the same statement, with the
// same guarantees and errors. See "database/sql" in the package doc for why they live here.

// SQLTxFunc is [TxFunc] for [Lessor.RunLockedSQL]: the caller's work inside tx, a
// database/sql transaction that holds the lease row FOR UPDATE, with the grant's fencing token
// (an int64 > 0). Returning an error rolls tx back; returning nil commits it. It must not commit
// or roll back tx itself.
type SQLTxFunc func(ctx context.Context, tx *sql.Tx, token Token) error

// FenceSQLTx is [FenceTx] inside tx, a database/sql transaction: it advances the high-water
// mark of resource to token, or returns a [*StaleTokenError] when a larger token has been seen
// (then roll tx back). Same statement, durability (synchronous_commit raised from off to on for
// tx) and errors as FenceTx; a nil tx is an [*ArgumentError]. Safe for concurrent use on
// different transactions (a *sql.Tx itself is not).
func FenceSQLTx(ctx context.Context, tx *sql.Tx, resource string, token Token) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	return fenceTx(ctx, sqltx.Wrap(tx), resource, token)
}

// UpdateFencedSQLTx is [UpdateFencedTx] inside tx, a database/sql transaction: the conditional
// update of a table that carries a token column, identifiers validated and quoted, the
// values of set and key passed to the driver as given (use values the driver encodes: lib/pq
// does not encode slices). Same statement, durability and errors as UpdateFencedTx.
func UpdateFencedSQLTx(ctx context.Context, tx *sql.Tx, table pgx.Identifier, tokenColumn string, token Token, set []Column, key []Column) (int64, error) {
	if tx == nil {
		return 0, argError("tx", "must not be nil")
	}
	return updateFencedTx(ctx, sqltx.Wrap(tx), table, tokenColumn, token, set, key)
}

// GuardSQLTx is [Lease.GuardTx] inside tx, a database/sql transaction: it checks that this
// grant is still current on the database and holds the lease row FOR KEY SHARE until tx ends,
// so no takeover commits before tx. Errors as GuardTx: a [*LeaseLostError] (Done then closes)
// when the database no longer has the grant. Use READ COMMITTED, as for GuardTx.
func (lease *Lease) GuardSQLTx(ctx context.Context, tx *sql.Tx) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	return lease.guardTx(ctx, sqltx.Wrap(tx))
}

// FenceSQLTx is [Lease.FenceTx] inside tx, a database/sql transaction: in one statement, the
// grant must still be current (else a [*LeaseLostError], and Done closes) and the high-water
// mark of resource advances to its token (else a [*StaleTokenError]). After any error, roll tx
// back. Same durability and errors as Lease.FenceTx.
func (lease *Lease) FenceSQLTx(ctx context.Context, tx *sql.Tx, resource string) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	return lease.fenceTx(ctx, sqltx.Wrap(tx), resource)
}

// GuardSQLTx is [LeaseSet.GuardTx] inside tx, a database/sql transaction: [Lease.GuardSQLTx]
// for every member, in name order.
func (s *LeaseSet) GuardSQLTx(ctx context.Context, tx *sql.Tx) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	return s.guardTx(ctx, sqltx.Wrap(tx))
}

// FenceSQLTx is [Term.FenceTx] inside tx, a database/sql transaction: [Lease.FenceSQLTx] for
// the term's lease.
func (t *Term) FenceSQLTx(ctx context.Context, tx *sql.Tx, resource string) error {
	return t.lease.FenceSQLTx(ctx, tx, resource)
}

// TryLockSQLTx is [AdvisoryLocker.TryLockTx] inside tx, a database/sql transaction: the
// transaction advisory lock of name (or of [AtKey]'s key) if it is free, released when tx
// ends, with its fencing token under [WithFencingTokens] (else 0). Errors as TryLockTx.
func (a *AdvisoryLocker) TryLockSQLTx(ctx context.Context, tx *sql.Tx, name string, opts ...LockOption) (Token, error) {
	return a.lockSQLTx(ctx, tx, name, opts, false)
}

// LockSQLTx is [AdvisoryLocker.LockTx] inside tx, a database/sql transaction: it waits in the
// server's lock queue until granted or ctx ends. When ctx ends first the statement is cancelled
// and database/sql rolls tx back, which releases anything it held. Errors as LockTx.
func (a *AdvisoryLocker) LockSQLTx(ctx context.Context, tx *sql.Tx, name string, opts ...LockOption) (Token, error) {
	return a.lockSQLTx(ctx, tx, name, opts, true)
}

func (a *AdvisoryLocker) lockSQLTx(ctx context.Context, tx *sql.Tx, name string, opts []LockOption, wait bool) (Token, error) {
	key, mode, err := a.target(name, opts)
	if err != nil {
		return 0, err
	}
	if tx == nil {
		return 0, argError("tx", "must not be nil")
	}
	return a.lockOnTx(ctx, sqltx.Wrap(tx), name, key, mode, wait)
}

// TryRunLockedSQL is [Lessor.TryRunLocked] with a database/sql transaction: it runs fn inside a
// new transaction of sqlDB that holds the lease row of name FOR UPDATE for its whole length,
// with a fresh fencing token, committed when fn returns nil. sqlDB must reach the database of
// the lessor's pool (the lease row is there): one pgxpool.Pool shared through pgx's
// stdlib.OpenDBFromPool, or a *sql.DB opened on the same database with any driver (pgx's
// stdlib, lib/pq). The grant costs a round trip of its own after BEGIN (database/sql has no
// batch). Errors as TryRunLocked, and an [*ArgumentError] for a nil sqlDB.
func (l *Lessor) TryRunLockedSQL(ctx context.Context, sqlDB *sql.DB, name string, fn SQLTxFunc) error {
	if err := validateRunLockedSQL(sqlDB, name, fn); err != nil {
		return err
	}
	return l.tryRunLocked(ctx, name, func() grantTx { return &sqlGrantTx{l: l, db: sqlDB, fn: fn} })
}

// RunLockedSQL is [Lessor.RunLocked] with a database/sql transaction, as [Lessor.TryRunLockedSQL]
// is TryRunLocked: it waits in the name's queue, with the lessor's other waiters, until the
// lease is free or ctx ends. While another transaction holds the row, its grant waits on the
// server's row lock; when ctx ends meanwhile, it returns only once that backend has let go
// (the lessor's pool cancels the grant and awaits the backend's exit), so nothing is held.
func (l *Lessor) RunLockedSQL(ctx context.Context, sqlDB *sql.DB, name string, fn SQLTxFunc) error {
	if err := validateRunLockedSQL(sqlDB, name, fn); err != nil {
		return err
	}
	return l.runLocked(ctx, name, func() grantTx { return &sqlGrantTx{l: l, db: sqlDB, fn: fn} })
}

func validateRunLockedSQL(sqlDB *sql.DB, name string, fn SQLTxFunc) error {
	if sqlDB == nil {
		return argError("sqlDB", "must not be nil")
	}
	return validateRunLocked(name, fn == nil)
}

// sqlGrantTx is a grantTx on a caller's *sql.DB.
type sqlGrantTx struct {
	l  *Lessor
	db *sql.DB
	fn SQLTxFunc
	tx *sql.Tx
}

func (g *sqlGrantTx) grant(ctx context.Context, p db.LeaseGrantParams) (int64, error) {
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, wrapPg("begin", err)
	}
	g.tx = tx
	c := sqltx.Wrap(tx)
	var pid uint32
	if !p.Nowait {
		// A waiting grant may be abandoned while its backend waits on the row lock (ctx ends;
		// the driver closes the connection or cancels the statement): the backend's pid lets
		// the lessor end it. A try grant never waits on a row lock.
		var backend int32
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
			return 0, wrapPg("begin", err)
		}
		pid = uint32(backend)
	}
	row, err := g.l.q.LeaseGrant(ctx, c, p)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, err
	case err != nil && pid != 0 && ctx.Err() != nil:
		if cerr := g.l.endAbandonedGrant(ctx, pid); cerr != nil {
			return 0, fmt.Errorf("grant: %w (and %w)", err, cerr)
		}
		return 0, wrapPg("grant", err)
	case err != nil:
		return 0, wrapPg("grant", err)
	}
	return row.Token, nil
}

func (g *sqlGrantTx) run(ctx context.Context, token Token) error { return g.fn(ctx, g.tx, token) }

func (g *sqlGrantTx) commit(context.Context) error { return g.tx.Commit() }

// rollback ends the transaction. database/sql rolls a transaction back by itself when its
// context ends; Rollback after that, or after Commit, returns sql.ErrTxDone and does nothing.
func (g *sqlGrantTx) rollback(context.Context) {
	if g.tx != nil {
		_ = g.tx.Rollback()
	}
}
