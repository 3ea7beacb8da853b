package fencelock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/pressly/goose/v3/lock"
)

var _ lock.Locker = (*migrateLocker)(nil)

// migrateLockID is the advisory lock key that serialises concurrent [Migrate] calls (see
// migrateLocker, below). It differs from goose's default key, so fencelock's migrations never wait on
// (or block) an application's own goose run.
const migrateLockID int64 = 0x66656e63656c6f63 // "fencelock" in ASCII, truncated to 8 bytes

// migrateLockWait bounds how long [Migrate] waits for another Migrate's lock: as long as goose's
// session locker waited before (300 tries, one a second).
const migrateLockWait = 5 * time.Minute

// migrateLockSQL takes the migration lock for the rest of the transaction. The subquery runs
// first (it holds volatile functions, so the planner keeps it apart), so its settings apply to
// the lock's own wait:
//   - idle_in_transaction_session_timeout 0: the transaction sits idle for the whole migration
//     run, which a server or role default would otherwise cut short, ending the lock;
//   - lock_timeout: a default lock_timeout would end the wait early; the server ends it when
//     Lock's context does, instead of waiting on after the client gave up (its socket closed).
//
// statement_timeout is not set here: it applies from the start of the statement that sets it,
// so the statement before sets it to 0 (migrateLockSetupSQL), with PostgreSQL 17's
// transaction_timeout, which would end the session in the middle of the run (set from version
// 17 on, which knows it; not exercised by the tests here, which run PostgreSQL 15). All are
// local to the transaction (set_config's is_local), so nothing is left on a connection that
// PgBouncer hands to another client afterwards.
const (
	migrateLockSetupSQL = `SELECT pg_catalog.set_config('statement_timeout', '0', true),
       CASE WHEN pg_catalog.current_setting('server_version_num')::integer >= 170000
            THEN pg_catalog.set_config('transaction_timeout', '0', true) END`
	migrateLockSQL = `SELECT pg_catalog.pg_advisory_xact_lock($1)
FROM (SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', '0', true),
             pg_catalog.set_config('lock_timeout', $2, true)) AS cfg`
)

// migrateLocker is the lock of [Migrate], in the shape of a goose [lock.Locker]: a
// transaction-scoped advisory lock (pg_advisory_xact_lock(migrateLockID)) held by a transaction
// left open, on a connection of its own taken from the *sql.DB given to Lock (Migrate's, outside
// the application's pool), from Lock until Unlock (which rolls it back).
//
// Why not goose's session locker (pg_advisory_lock, [lock.NewPostgresSessionLocker]), used
// before: behind PgBouncer in transaction mode a session lock stays on whatever server
// connection ran the locking statement, which PgBouncer then lends to other clients, so it
// excludes nobody (pressly/goose#972). An open transaction keeps its server connection until it
// ends, so a lock of the transaction excludes there too, and ends with the transaction when
// the client dies (its connection closes, and PgBouncer closes the server connection of a
// client that left in a transaction). A fencelock lease cannot serve: the Lessor's statements
// need the schema at the code's own version, which is what Migrate is bringing about.
//
// Migrate calls of earlier versions, which took the same key at session level (goose's session
// locker: pg_try_advisory_lock(migrateLockID), once a second), and calls of this one exclude
// each other: session-level and transaction-level advisory locks of one key are the same lock
// in Postgres (one lock tag, ExclusiveLock), differing only in when they are released. Checked
// both ways: TestMigrateWaitsForSessionLockOfEarlierVersion (a session lock holds this Migrate
// off) and TestMigrateLockHeldAcrossMigrationBehindPgBouncer (pg_try_advisory_lock is refused
// while this Migrate holds the lock).
//
// One migrateLocker serves one Migrate call, which calls Lock and Unlock in turn from one
// goroutine; it is not safe for concurrent use otherwise.
type migrateLocker struct {
	conn   *sql.Conn
	tx     *sql.Tx
	cancel context.CancelFunc // ends the transaction's context, after Unlock's rollback
}

// Lock takes the migration lock, waiting at most migrateLockWait (and no longer than ctx).
//
// Errors: ctx's error, wrapped, when ctx ends first; one saying the lock was not granted when
// migrateLockWait passes; an error when this locker already holds the lock; otherwise the
// error of database/sql or pgx, wrapped. Nothing is held after an error.
func (l *migrateLocker) Lock(ctx context.Context, db *sql.DB) (err error) {
	if l.tx != nil {
		return errors.New("migration lock: already held by this Migrate")
	}
	wait, cancelWait := context.WithTimeout(ctx, migrateLockWait)
	defer cancelWait()
	defer func() {
		if err == nil {
			return
		}
		switch {
		case ctx.Err() != nil && !errors.Is(err, ctx.Err()):
			err = fmt.Errorf("migration lock: %w: %w", ctx.Err(), err)
		case ctx.Err() != nil:
			err = fmt.Errorf("migration lock: %w", err)
		case wait.Err() != nil || pgCode(err) == "55P03":
			err = fmt.Errorf("migration lock: not granted within %v: another Migrate is applying migrations (or a session holds advisory lock %d): %w",
				migrateLockWait, migrateLockID, err)
		default:
			err = wrapPg("migration lock", err)
		}
	}()

	conn, err := db.Conn(wait)
	if err != nil {
		return err
	}
	// database/sql rolls a transaction back when the context given to BeginTx ends, and the
	// transaction must outlive Lock: it gets a context of its own, which Unlock ends. Until
	// Lock returns, the wait's end ends it too (the BEGIN included).
	txCtx, cancelTx := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(wait, cancelTx)
	var tx *sql.Tx
	fail := func(err error) error {
		stop()
		if tx != nil {
			_ = tx.Rollback() // sql.ErrTxDone when the wait's end has rolled it back already
		}
		cancelTx()
		return errors.Join(err, conn.Close())
	}
	tx, err = conn.BeginTx(txCtx, nil)
	if err != nil {
		return fail(err)
	}
	if _, err := tx.ExecContext(wait, migrateLockSetupSQL); err != nil {
		return fail(err)
	}
	// The server ends the wait a moment after wait ends, unless the client's cancellation
	// reaches it first: either way the error below says the lock was not granted.
	timeout := max(time.Until(deadlineOf(wait))+time.Second, time.Millisecond) // 0 would mean no limit
	if _, err := tx.ExecContext(wait, migrateLockSQL, migrateLockID, fmt.Sprintf("%dms", timeout.Milliseconds())); err != nil {
		return fail(err)
	}
	if !stop() {
		// The wait ended just as the lock was granted: cancelTx has run, so database/sql is
		// rolling the transaction back. Nothing is held.
		return fail(wait.Err())
	}
	l.conn, l.tx, l.cancel = conn, tx, cancelTx
	return nil
}

// Unlock releases the lock taken by Lock: it rolls the lock's transaction back (the lock goes
// with it) and closes its connection. The db argument is ignored: the lock lives on the
// connection Lock took.
//
// Unlock does not use ctx: the rollback runs on the transaction's own context, which Lock
// detached from ctx's cancellation, so it finishes when ctx has ended (a run cancelled
// midway). It is bounded by cleanupTimeout (5 s) of its own: past it the transaction's context
// ends, pgx cancels the rollback and closes the connection, which ends the session and the
// lock with it.
//
// Errors: an error when Lock holds nothing; otherwise the rollback's and close's errors, joined
// and wrapped. When the rollback fails because the connection broke, the server has ended the
// transaction, and the lock with it, or will once it notices.
func (l *migrateLocker) Unlock(_ context.Context, _ *sql.DB) error {
	if l.tx == nil {
		return errors.New("migration lock: not held")
	}
	conn, tx, cancel := l.conn, l.tx, l.cancel
	l.conn, l.tx, l.cancel = nil, nil, nil
	bound := time.AfterFunc(cleanupTimeout, cancel)
	err := tx.Rollback()
	bound.Stop()
	cancel()
	if err := errors.Join(err, conn.Close()); err != nil {
		return fmt.Errorf("release migration lock: %w", err)
	}
	return nil
}

// deadlineOf returns ctx's deadline; ctx must have one.
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}
