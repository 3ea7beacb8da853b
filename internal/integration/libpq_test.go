package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The database/sql forms through lib/pq, which cancels a statement with a cancel request and
// keeps the connection (pgx's stdlib closes it), begins every transaction READ WRITE, and
// reports errors as *pq.Error: the same promises as with pgx's stdlib
// (database_sql_test.go in the root package).

// openSQLDB opens a *sql.DB on url with driver, closed at test cleanup.
func openSQLDB(t *testing.T, driver, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// openLibPQ returns a *sql.DB on b's database through lib/pq, closed at test cleanup.
func openLibPQ(t *testing.T, b *bundle) *sql.DB {
	t.Helper()
	return openSQLDB(t, "postgres", b.DB.URL)
}

// RunLockedSQL whose grant waits on the row lock when ctx ends returns at once with ctx's
// error, once its backend has let go, although with lib/pq that backend stays alive (lib/pq
// cancels the statement and database/sql keeps the connection): the call must not wait for
// the backend to exit.
func TestLibpqRunLockedSQLCancelledOnRowLockReturnsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	took, err := fencetest.CancelRunLockedSQLOnRowLock(t, b.Ctx, b.Pool, openLibPQ(t, b))
	require.Less(t, took, time.Second, "RunLockedSQL returned %v after ctx ended: %v", took, err)
	require.ErrorIs(t, err, context.Canceled, "returned %v after ctx ended", took)
}

// The sentinels through lib/pq: the twins wrap lib/pq's *pq.Error (SQLState) as they wrap
// pgx's, and WrapSQLError maps a trigger's refusal and the SQL API's.
func TestLibpqErrorsMatchSentinels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sqlDB := openLibPQ(t, b)
	ctx := b.Ctx
	l := newLessor(t, b.Pool, "a")
	lease, err := l.TryAcquire(ctx, "job", time.Minute)
	require.NoError(t, err)

	inTx := func(ro bool, fn func(tx *sql.Tx) error) error {
		tx, err := sqlDB.BeginTx(ctx, &sql.TxOptions{ReadOnly: ro})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
	// Read-only transactions: 25006 -> ErrReadOnly.
	require.ErrorIs(t, inTx(true, func(tx *sql.Tx) error { return fencelock.FenceSQLTx(ctx, tx, "r", 5) }), fencelock.ErrReadOnly, "FenceSQLTx")
	require.ErrorIs(t, inTx(true, func(tx *sql.Tx) error { return lease.GuardSQLTx(ctx, tx) }), fencelock.ErrReadOnly, "GuardSQLTx")
	require.ErrorIs(t, inTx(true, func(tx *sql.Tx) error { return lease.FenceSQLTx(ctx, tx, "r") }), fencelock.ErrReadOnly, "Lease.FenceSQLTx")
	a, err := fencelock.NewAdvisoryLocker(b.Pool, fencelock.WithFencingTokens())
	require.NoError(t, err)
	require.ErrorIs(t, inTx(true, func(tx *sql.Tx) error { _, err := a.TryLockSQLTx(ctx, tx, "x"); return err }), fencelock.ErrReadOnly, "TryLockSQLTx with tokens")
	select {
	case <-lease.Done():
		t.Fatal("a read-only refusal ended the lease")
	default:
	}
	// (RunLockedSQL on a read-only server: TestLibpqRunLockedSQLOnHotStandbyReadOnly. lib/pq
	// begins every transaction READ WRITE, overriding default_transaction_read_only.)

	// Stale tokens.
	require.NoError(t, inTx(false, func(tx *sql.Tx) error { return fencelock.FenceSQLTx(ctx, tx, "r", 7) }))
	err = inTx(false, func(tx *sql.Tx) error { return fencelock.FenceSQLTx(ctx, tx, "r", 6) })
	var stale *fencelock.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, fencelock.Token(7), stale.Current)

	// A protected table's refusals through lib/pq.
	_, err = b.Pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, qty bigint NOT NULL, fence_token bigint);
		SELECT fencelock.protect_table('items')`)
	require.NoError(t, err)
	err = inTx(false, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO items VALUES ('a', 1, NULL)`)
		return fencelock.WrapSQLError(err)
	})
	require.ErrorIs(t, err, fencelock.ErrNoToken)
	var pqErr *pq.Error
	require.ErrorAs(t, err, &pqErr)
	require.NoError(t, inTx(false, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `SELECT fencelock.set_token(10); INSERT INTO items VALUES ('a', 1, NULL)`)
		return err
	}))
	upd := func(token fencelock.Token) error {
		return inTx(false, func(tx *sql.Tx) error {
			_, err := fencelock.UpdateFencedSQLTx(ctx, tx, pgx.Identifier{"items"}, "fence_token", token,
				[]fencelock.Column{{Name: "qty", Value: int64(2)}}, []fencelock.Column{{Name: "id", Value: "a"}})
			return err
		})
	}
	require.NoError(t, upd(10), "same token again passes (UpdateFencedSQLTx passes its token to the trigger)")
	require.NoError(t, upd(11))
	require.ErrorIs(t, upd(9), fencelock.ErrStaleToken)
	err = inTx(false, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `SELECT fencelock.set_token(9)`)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, `DELETE FROM items WHERE id = 'a'`)
		return fencelock.WrapSQLError(err)
	})
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
	// FL007 from the SQL API through lib/pq.
	_, err = sqlDB.ExecContext(ctx, `SELECT fencelock.fence('', 1)`)
	require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrInvalidArgument)
	var pgErr *pgconn.PgError
	require.False(t, errors.As(err, &pgErr))
}

// RunLockedSQL through lib/pq: contended, it waits in the queue and runs within a second of
// the holder's release (DESIGN.md: a release wakes the head of the queue), with a larger
// token, and its fenced write commits.
func TestLibpqRunLockedSQLRunsOnRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sqlDB := openLibPQ(t, b)
	sqlDB.SetMaxOpenConns(1)
	l := newLessor(t, b.Pool, "a", fastBackoff)
	h := newLessor(t, b.Pool, "h")
	lease, err := h.TryAcquire(b.Ctx, "job", time.Minute)
	require.NoError(t, err)
	done := make(chan error, 1)
	var got fencelock.Token
	go func() {
		done <- l.RunLockedSQL(b.Ctx, sqlDB, "job", func(ctx context.Context, tx *sql.Tx, token fencelock.Token) error {
			got = token
			return fencelock.FenceSQLTx(ctx, tx, "job", token)
		})
	}()
	started := time.Now()
	awaitQueue(t, b.Ctx, b.Pool, "job", false, "a")
	t.Logf("queued %v after the call", time.Since(started))
	released := time.Now()
	require.NoError(t, lease.Release(b.Ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("RunLockedSQL did not run within 10 s of the release")
	}
	took := time.Since(released)
	t.Logf("ran %v after the release", took)
	require.Less(t, took, time.Second, "a release wakes the head of the queue (DESIGN.md: within milliseconds)")
	require.Greater(t, got, lease.Token())
}

// On a hot standby, TryRunLockedSQL returns an error wrapping ErrReadOnly (its doc), with
// lib/pq too, whose READ WRITE BEGIN a standby refuses (SQLSTATE 0A000) before the grant runs;
// and with pgx's stdlib (control).
func TestLibpqRunLockedSQLOnHotStandbyReadOnly(t *testing.T) {
	t.Parallel()
	ctx, url, pool := hotStandbyDB(t)
	l := newLessor(t, pool, "on-standby")
	for _, driver := range []string{"postgres", "pgx"} {
		err := l.TryRunLockedSQL(ctx, openSQLDB(t, driver, url), "lease", func(context.Context, *sql.Tx, fencelock.Token) error { return nil })
		require.ErrorIs(t, err, fencelock.ErrReadOnly, "%s: %v", driver, err)
	}
}
