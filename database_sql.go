package fencelock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

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
// server's lock queue until granted or ctx ends (one round trip more than LockTx: the session's
// pid, for that end). When ctx ends first, database/sql rolls tx back (and the driver may close
// the connection), which releases anything it held; the call returns ctx's error (wrapped) only
// once the server no longer has the backend waiting for or holding the key, bounded by 5 s.
// Errors as LockTx.
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
	c := sqltx.Wrap(tx)
	var pid uint32
	if wait {
		// database/sql gives no access to the session: ask it, for a wait that ctx may end.
		var backend int32
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
			return 0, wrapPg(fmt.Sprintf("lock %s in transaction", describeLock(name, key)), err)
		}
		pid = uint32(backend)
	}
	return a.lockOnTx(ctx, c, pid, name, key, mode, wait)
}

// TryRunLockedSQL is [Lessor.TryRunLocked] with a database/sql transaction: it runs fn inside a
// new transaction of sqlDB that holds the lease row of name FOR UPDATE for its whole length,
// with a fresh fencing token, committed when fn returns nil. sqlDB must reach the database of
// the lessor's pool (the lease row is there): one pgxpool.Pool shared through pgx's
// stdlib.OpenDBFromPool, or a *sql.DB opened on the same database with any driver (pgx's
// stdlib, lib/pq). It costs two round trips more than TryRunLocked (database/sql has no batch:
// BEGIN, then the session's pid and the transaction's start, which let a call that gives up
// make sure the server ended its transaction before it returns, then the grant). Errors as
// TryRunLocked, and an [*ArgumentError] for a nil sqlDB; on a hot standby, an error wrapping
// [ErrReadOnly] with lib/pq too (it begins READ WRITE, which a standby refuses with SQLSTATE
// 0A000).
//
// When ctx ends, the call returns ctx's error (wrapped, with the driver's) only once the
// server no longer runs the transaction: a grant still waiting on the row lock is cancelled,
// and a transaction that holds the row is rolled back and its end awaited (database/sql rolls
// back in a goroutine of its own; the lessor's pool watches the backend), bounded by 5 s. That
// holds at every step, whatever the driver reports (lib/pq reports a statement that ctx ended
// as the server's cancellation, SQLSTATE 57014, not as ctx's error): an error of fn's, or of
// the commit, once ctx has ended is returned joined with ctx's cause ([context.Cause]), so
// errors.Is matches both, unless it matches that cause already.
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
	// The backend that runs the transaction, and the transaction's start (now() in it): what
	// identifies the transaction in pg_stat_activity when the call gives up on it. 0: not
	// known yet.
	pid       uint32
	xactStart time.Time
	settled   bool // the transaction was seen ended after ctx ended
}

func (g *sqlGrantTx) grant(ctx context.Context, p db.LeaseGrantParams) (int64, error) {
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, g.beginError(ctx, err)
	}
	g.tx = tx
	c := sqltx.Wrap(tx)
	// database/sql gives no access to the session, so ask it: a call that gives up (ctx
	// ends) while its grant waits on the row lock, or while it holds the row, must return
	// only once the server has ended that transaction (see settle).
	var backend int32
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid(), now()`).Scan(&backend, &g.xactStart); err != nil {
		return 0, g.failed(ctx, "begin", err)
	}
	g.pid = uint32(backend)
	row, err := g.l.q.LeaseGrant(ctx, c, p)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, err
	case err != nil:
		return 0, g.failed(ctx, "grant", err)
	}
	return row.Token, nil
}

// beginError wraps a failed BEGIN: lib/pq begins READ WRITE, which a hot standby refuses with
// SQLSTATE 0A000 rather than 25006, so that refusal is told apart by asking the server.
func (g *sqlGrantTx) beginError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("begin: %w", withCause(ctx, err))
	}
	if sqlState(err) == "0A000" {
		var standby bool
		if qerr := g.db.QueryRowContext(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); qerr == nil && standby {
			return fmt.Errorf("begin: %w: %w", ErrReadOnly, err)
		}
	}
	return wrapPg("begin", err)
}

// failed wraps a statement's error; after ctx ended, it first settles the transaction, and
// the error then wraps ctx's cause too (see ended).
func (g *sqlGrantTx) failed(ctx context.Context, what string, err error) error {
	if ctx.Err() == nil {
		return wrapPg(what, err)
	}
	return fmt.Errorf("%s: %w", what, g.ended(ctx, err))
}

// ended returns err, which a step of the transaction met after ctx ended, joined with ctx's
// cause (withCause), once settle has ended the transaction; settle's own error, if any, is
// added to it. A driver may report a statement that ctx ended as the server's cancellation
// (lib/pq: SQLSTATE 57014), or as database/sql's sql.ErrTxDone once database/sql has rolled
// back, rather than as ctx's error.
func (g *sqlGrantTx) ended(ctx context.Context, err error) error {
	err = withCause(ctx, err)
	if serr := g.settle(ctx); serr != nil {
		return fmt.Errorf("%w (and %w)", err, serr)
	}
	return err
}

// withCause returns err joined with the cause of ctx, which has ended, so that errors.Is
// matches both; err as is when it matches that cause already (pgx's stdlib reports ctx's
// error).
func withCause(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if errors.Is(err, cause) {
		return err
	}
	return errors.Join(cause, err)
}

// settle, once ctx has ended, rolls the transaction back (database/sql may already have, in
// its own goroutine) and returns once the server no longer runs it: a grant still waiting on
// the row lock is cancelled, and the backend is awaited until it has exited or left the
// transaction, detached from ctx and bounded by cleanupTimeout. So a call that gave up holds
// nothing when it returns, whatever the driver does on cancellation and whatever the latency.
func (g *sqlGrantTx) settle(ctx context.Context) error {
	if g.settled || g.tx == nil {
		return nil
	}
	g.settled = true
	_ = g.tx.Rollback() // sql.ErrTxDone when database/sql rolled it back already
	if g.pid == 0 {
		return nil
	}
	return g.l.endAbandonedTx(ctx, g.pid, g.xactStart)
}

// run calls fn; an error it returns once ctx has ended is returned, after settle, joined with
// ctx's cause (see ended), and otherwise as is.
func (g *sqlGrantTx) run(ctx context.Context, token Token) error {
	err := g.fn(ctx, g.tx, token)
	if err == nil || ctx.Err() == nil {
		return err
	}
	return g.ended(ctx, err)
}

// commit commits the transaction; when ctx ended meanwhile, database/sql may refuse
// (ctx's error, without its cause, or sql.ErrTxDone once it rolled back) or the driver report
// the server's cancellation: that error is returned, after settle, joined with ctx's cause.
func (g *sqlGrantTx) commit(ctx context.Context) error {
	err := g.tx.Commit()
	if err == nil || ctx.Err() == nil {
		return err
	}
	return g.ended(ctx, err)
}

// rollback ends the transaction: after ctx ended, by settle (an error it meets is logged: the
// call already returns ctx's); otherwise database/sql's Rollback, which after Commit, or once
// database/sql rolled back, returns sql.ErrTxDone and does nothing.
func (g *sqlGrantTx) rollback(ctx context.Context) {
	if g.tx == nil {
		return
	}
	if ctx.Err() != nil {
		if err := g.settle(ctx); err != nil {
			g.l.cfg.common.logger.Warn("fencelock: run locked: the abandoned transaction did not end", "error", err)
		}
		return
	}
	_ = g.tx.Rollback()
}
