package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/queue"
	"github.com/fencelock/fencelock/internal/timing"
)

// TxFunc is the caller's work under a transaction-scoped lease: it runs inside tx, which holds
// the lease row FOR UPDATE, and gets the grant's fencing token (an int64 > 0). Returning an
// error rolls tx back; returning nil commits it. It must not commit or roll back tx itself.
type TxFunc func(ctx context.Context, tx pgx.Tx, token Token) error

// TryRunLocked runs fn inside a new transaction that holds the lease row of name FOR UPDATE
// for its whole length, with a fresh fencing token: no TTL, no heartbeat, released by commit
// or rollback, and exclusive with TTL leases of the same name (theirs wait or fail while the
// transaction runs; it is refused while a TTL lease is held). The grant is one statement after
// BEGIN; it writes the lease row and raises synchronous_commit from off to on for the transaction,
// so its token is durable when the commit returns (even when it falls in a range of the token
// sequence that a rolled-back transaction WAL-logged: the commit flushes the WAL up to its own
// record). Before that, the token is the transaction's: do not hand it outside tx.
//
// It does not wait: [ErrNotAcquired] if a TTL holder has the lease, another transaction holds
// the row, or anyone waits in the name's queue (it does not barge, as [Lessor.TryAcquire]). name is as for [Lessor.TryAcquire]. Errors: an [*ArgumentError] for a bad name or
// nil fn (no SQL runs); fn's error, returned as is, after rollback; an error wrapping
// [ErrReadOnly] on a hot standby; an error wrapping [ErrTokenSequence] for a misconfigured
// token sequence, [ErrTokenBudget] when the token budget is spent or [ErrTokenEpochBehind]
// when the epoch went back; otherwise the pgx error, wrapped.
//
// When ctx ends while fn runs, the transaction is rolled back, not committed (even when fn
// returns nil; the error then wraps ctx's cause), and the rollback itself runs detached from
// ctx, bounded by 5 s of its own: the row is free and the connection back in the pool when
// the call returns.
//
// Because it needs one transaction only, this mode works behind PgBouncer transaction pooling.
func (l *Lessor) TryRunLocked(ctx context.Context, name string, fn TxFunc) error {
	if err := validateRunLocked(name, fn == nil); err != nil {
		return err
	}
	return l.tryRunLocked(ctx, name, func() grantTx { return &pgxGrantTx{l: l, fn: fn} })
}

// RunLocked is [Lessor.TryRunLocked] that waits until the lease is free or ctx ends. While
// another transaction holds the row it waits on the server's row lock, in the server's queue;
// while a TTL holder has the lease, or others wait for it, it rolls back, takes its place in
// the name's queue of waiters, first come, first served, with [Lessor.Acquire]'s waiters (a
// release wakes it when it is at the head, and leaves the lease free for it), and tries again
// in a new transaction, so it never holds the row locked against the holder's renewals.
//
// Errors: as for TryRunLocked (fn's error, even one matching [ErrNotAcquired], is returned
// as is and never retried); ctx's error (wrapped) when ctx ends first, with nothing held.
//
// The transaction has the server's default isolation. Under REPEATABLE READ or SERIALIZABLE
// a contended grant fails with a serialization error (SQLSTATE 40001) instead of queueing:
// retry the call, or use READ COMMITTED, the Postgres default.
func (l *Lessor) RunLocked(ctx context.Context, name string, fn TxFunc) error {
	if err := validateRunLocked(name, fn == nil); err != nil {
		return err
	}
	return l.runLocked(ctx, name, func() grantTx { return &pgxGrantTx{l: l, fn: fn} })
}

// validateRunLocked checks a RunLocked call's name and whether its fn is nil.
func validateRunLocked(name string, fnIsNil bool) error {
	if err := validateName("name", name); err != nil {
		return err
	}
	if fnIsNil {
		return argError("fn", "must not be nil")
	}
	return nil
}

// grantTx is one attempt's transaction, on the transport of the call: pgx (the lessor's
// pool) or database/sql (the caller's *sql.DB). A new one serves each attempt.
type grantTx interface {
	// grant begins the transaction and runs LeaseGrant in it, returning the token, or
	// pgx.ErrNoRows when the grant was refused or the name has no row. It returns only once
	// nothing the grant may have taken is held on the server, whatever ctx did.
	grant(ctx context.Context, p db.LeaseGrantParams) (int64, error)
	// run calls the caller's fn inside the transaction.
	run(ctx context.Context, token Token) error
	commit(ctx context.Context) error
	// rollback ends the transaction detached from ctx (bounded by cleanupTimeout); after
	// commit, or once ended, it does nothing.
	rollback(ctx context.Context)
}

// tryRunLocked is TryRunLocked on the transport newTx makes.
func (l *Lessor) tryRunLocked(ctx context.Context, name string, newTx func() grantTx) error {
	err := notAcquired(l.runLockedAttempt(ctx, name, newTx, nil, true, false))
	if err == ErrNotAcquired {
		l.cfg.common.metrics.contention(mTryRunLocked)
	}
	return err
}

// runLocked is RunLocked on the transport newTx makes.
func (l *Lessor) runLocked(ctx context.Context, name string, newTx func() grantTx) error {
	live := timing.RunLockedLiveness
	return l.waitInQueue(ctx, "run locked", name, live, false, func(w *queue.Wait, stopWaiting func()) (attemptInfo, error) {
		// stopWaiting: the transaction got the row, no longer waiting while fn runs.
		if err := l.runLockedAttempt(ctx, name, newTx, stopWaiting, false, false); !errors.Is(err, errRefused) {
			return attemptInfo{}, err
		}
		a, err := l.joinQueue(ctx, name, w, live)
		if err != nil {
			return a, err
		}
		return a, errRefused
	})
}

// refusedOrAbsent tells a refused transaction-scoped grant (someone holds the name) from one
// that found no row to lock: it then creates the row, committed on its own, and tries again,
// once (ensured is then true).
func (l *Lessor) refusedOrAbsent(ctx context.Context, name string, newTx func() grantTx, got func(), try, ensured bool) error {
	if ensured {
		return errRefused // created, then deleted again (a sweep) or still being inserted
	}
	_, err := l.q.LeaseRemaining(ctx, l.pool, name)
	switch {
	case err == nil:
		return errRefused
	case !errors.Is(err, pgx.ErrNoRows):
		return wrapPg(fmt.Sprintf("run locked %q", name), err)
	}
	if err := l.q.LeaseEnsureRow(ctx, l.pool, db.LeaseEnsureRowParams{Name: name, Holder: l.cfg.holder}); err != nil {
		return wrapPg(fmt.Sprintf("run locked %q: create row", name), err)
	}
	return l.runLockedAttempt(ctx, name, newTx, got, try, true)
}

// runLockedAttempt makes one attempt: fn's outcome, errRefused, or another error. got, when
// not nil, runs once the transaction has the row, before fn. The grant never inserts the lease
// row inside the transaction (see LeaseGrant's may_insert); when the name has no row yet, the
// attempt creates it and tries once more.
func (l *Lessor) runLockedAttempt(ctx context.Context, name string, newTx func() grantTx, got func(), try, ensured bool) error {
	tx := newTx()
	// After commit this is a no-op. Detached from ctx, so a cancelled ctx still rolls back and
	// the connection goes back to the pool.
	defer tx.rollback(ctx)
	token, err := tx.grant(ctx, db.LeaseGrantParams{Name: name, Holder: l.cfg.holder, TtlUs: 0, Nowait: try, MayInsert: false})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		tx.rollback(ctx)
		return l.refusedOrAbsent(ctx, name, newTx, got, try, ensured)
	case err != nil:
		return fmt.Errorf("run locked %q: %w", name, err)
	case token <= 0:
		// LeaseGrant's placeholder is never written; a token that is not positive would be
		// no fencing token at all.
		return fmt.Errorf("run locked %q: the grant returned token %d; fencing tokens are > 0", name, token)
	}
	if try {
		l.cfg.common.metrics.granted(mTryRunLocked)
	} else {
		l.cfg.common.metrics.granted(mRunLocked)
	}
	if got != nil {
		got()
	}
	if err := tx.run(ctx, Token(token)); err != nil {
		return err
	}
	if ctx.Err() != nil {
		// ctx ended during fn: roll back (deferred) rather than send a COMMIT that the driver
		// would refuse and answer by closing the connection, which would leave the row locked
		// until the server noticed.
		return fmt.Errorf("run locked %q: not committed: %w", name, context.Cause(ctx))
	}
	if err := tx.commit(ctx); err != nil {
		return wrapPg(fmt.Sprintf("run locked %q: commit", name), err)
	}
	return nil
}

// pgxGrantTx is a grantTx on the lessor's pool. BEGIN and the grant travel in one batch, so
// the grant costs no round trip of its own.
type pgxGrantTx struct {
	l  *Lessor
	fn TxFunc
	tx pgx.Tx
}

func (g *pgxGrantTx) grant(ctx context.Context, p db.LeaseGrantParams) (int64, error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	g.l.q.QueueLeaseGrant(b, p)
	br := g.l.pool.SendBatch(ctx, b)
	g.tx = br.Tx()
	var pid uint32 // 0 when the pool gave no connection (tx has none)
	if c := g.tx.Conn(); c != nil {
		pid = c.PgConn().PID()
	}
	_, beginErr := br.Exec()
	var token int64
	var expiresAt time.Time
	grantErr := br.QueryRow().Scan(&token, &expiresAt)
	closeErr := br.Close() // repeats the first error, if any
	if (beginErr != nil || grantErr != nil) && pid != 0 && g.tx.Conn().IsClosed() {
		// Abandoned mid-flight (ctx ended while the grant waited on the row; pgx then closes
		// the connection, and reports it on whichever result it was reading): the backend
		// would go on waiting, unaware, and take the row once its holder commits, until it
		// found the connection gone. End it, and return only once it has exited, so nothing
		// is left waiting or held.
		if err := g.l.endAbandonedGrant(ctx, pid); err != nil {
			return 0, fmt.Errorf("%w (and %w)", errors.Join(beginErr, grantErr), err)
		}
	}
	switch {
	case beginErr != nil:
		return 0, wrapPg("begin", beginErr)
	case errors.Is(grantErr, pgx.ErrNoRows):
		return 0, grantErr
	case grantErr != nil:
		return 0, wrapPg("grant", grantErr)
	case closeErr != nil:
		return 0, wrapPg("grant", closeErr)
	}
	return token, nil
}

func (g *pgxGrantTx) run(ctx context.Context, token Token) error { return g.fn(ctx, g.tx, token) }

func (g *pgxGrantTx) commit(ctx context.Context) error { return g.tx.Commit(ctx) }

func (g *pgxGrantTx) rollback(ctx context.Context) {
	if g.tx != nil {
		rollbackDetached(ctx, g.tx)
	}
}

// rollbackDetached rolls tx back on ctx's values without its cancellation, bounded by
// cleanupTimeout: a transaction whose caller's ctx has ended still ends on the server at once,
// its connection back in the pool. After Commit or an earlier rollback it does nothing.
func rollbackDetached(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// endAbandonedGrant cancels the grant statement that the backend with pid may still run for
// a connection the client abandoned, and then waits until that backend has exited, for at
// most cleanupTimeout, detached from ctx. When no backend with pid runs a grant in this
// database (it has exited, or pid is a pooler's), there is nothing to cancel or await.
func (l *Lessor) endAbandonedGrant(ctx context.Context, pid uint32) error {
	cctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	var cancelled int64
	if err := l.pool.QueryRow(cctx, cancelGrantSQL, int32(pid)).Scan(&cancelled); err != nil {
		return fmt.Errorf("cancel abandoned grant on backend %d: %w", pid, err)
	}
	if cancelled == 0 {
		return nil
	}
	return awaitBackendExit(cctx, l.pool, pid)
}

// endAbandonedTx ends what a transaction the caller gave up on may still hold: the grant
// statement it may still run on the backend with pid is cancelled (cancelGrantSQL), and the
// call waits until that backend no longer runs the transaction that started at xactStart
// (it exited, rolled back, or runs another one), for at most cleanupTimeout, detached from ctx.
func (l *Lessor) endAbandonedTx(ctx context.Context, pid uint32, xactStart time.Time) error {
	cctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	var cancelled int64
	if err := l.pool.QueryRow(cctx, cancelGrantSQL, int32(pid)).Scan(&cancelled); err != nil {
		return fmt.Errorf("cancel abandoned grant on backend %d: %w", pid, err)
	}
	return awaitTransactionEnd(cctx, l.pool, pid, xactStart)
}

// joinQueue puts a RunLocked that was refused in the name's queue, or refreshes its place.
func (l *Lessor) joinQueue(ctx context.Context, name string, w *queue.Wait, live time.Duration) (attemptInfo, error) {
	l.mu.Lock()
	id, channel := w.ID, l.listen.Channel()
	l.mu.Unlock()
	row, err := l.q.LeaseJoinQueue(ctx, l.pool, db.LeaseJoinQueueParams{Name: name, Holder: l.cfg.holder, WaitID: id, Channel: channel, LiveUs: live.Microseconds()})
	if err != nil {
		return attemptInfo{}, wrapPg(fmt.Sprintf("run locked %q: join the queue", name), err)
	}
	return attemptInfo{joined: row.Joined, listening: channel != "", ahead: row.Ahead, remaining: time.Duration(row.RemainingUs) * time.Microsecond}, nil
}
