package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/internal/timing"
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
	// A call that waited for the backend to exit would return only at the 5 s bound of its
	// cleanup (cleanupTimeout): 3 s tells the two apart with room for a loaded machine (1 s
	// was the machine's speed).
	require.Less(t, took, 3*time.Second, "RunLockedSQL returned %v after ctx ended: %v", took, err)
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

// RunLockedSQL through lib/pq: contended, it waits in the queue and runs on the holder's
// release, woken by it (a release wakes the head of the queue), with a larger token, and its
// fenced write commits. Woken, not found at its next refresh, told by the database's clock
// rather than by a bound the machine must beat: a waiter that listens sleeps a refresh period
// (a third of timing.RunLockedLiveness, 333 ms) after each refresh of its queue row unless it
// is woken, so a transaction for fn that began less than that after the row's last refresh
// (read while fn runs; the row leaves the queue only when the call returns) was woken. The
// release follows a refresh the test saw, leaving the wake-up most of the period; a round in
// which the refresh came first anyway (a machine slower than 333 ms from release to fn)
// proves nothing either way and is run again, up to 5 rounds: a release that wakes nobody
// fails them all, however fast the machine.
func TestLibpqRunLockedSQLRunsOnRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sqlDB := openLibPQ(t, b)
	sqlDB.SetMaxOpenConns(1)
	l := newLessor(t, b.Pool, "a", fastBackoff)
	h := newLessor(t, b.Pool, "h")
	refresh := timing.RunLockedLiveness / 3 // timing.QueueWait for a listening head with time left
	const rounds = 5
	for round := 1; ; round++ {
		after, refreshed := libpqRunOnRelease(t, b, sqlDB, l, h)
		if refreshed && after < refresh {
			t.Logf("round %d: fn's transaction began %v after the waiter's last refresh (the next was due %v after it): woken by the release", round, after, refresh)
			return
		}
		t.Logf("round %d: fn's transaction began %v after the waiter's last refresh (its own look was due at %v; a join: %v): not told apart", round, after, refresh, !refreshed)
		require.Less(t, round, rounds, "in %d rounds RunLockedSQL never ran before its waiter's next refresh: the release does not wake it", rounds)
	}
}

// libpqRunOnRelease is one round of TestLibpqRunLockedSQLRunsOnRelease: h holds "job", l's
// RunLockedSQL queues behind it and listens, and h releases just after the waiter refreshed
// its place. It returns how long after the waiter's last queue statement (database clock) fn's
// transaction began, and whether that statement was a refresh (false: a join, after which the
// waiter looks again after joinRecheck, 20 ms, whether woken or not).
func libpqRunOnRelease(t *testing.T, b *bundle, sqlDB *sql.DB, l, h *fencelock.Lessor) (time.Duration, bool) {
	t.Helper()
	lease, err := h.TryAcquire(b.Ctx, "job", time.Minute)
	require.NoError(t, err)
	type ran struct {
		token         fencelock.Token
		began         time.Time // now() in fn's transaction
		since, expiry time.Time // the waiter's queue row, committed: its last queue statement
	}
	var got ran
	done := make(chan error, 1)
	go func() {
		done <- l.RunLockedSQL(b.Ctx, sqlDB, "job", func(ctx context.Context, tx *sql.Tx, token fencelock.Token) error {
			got.token = token
			if err := tx.QueryRowContext(ctx, `SELECT now()`).Scan(&got.began); err != nil {
				return err
			}
			if err := b.Pool.QueryRow(ctx, `SELECT since, expires_at FROM fencelock.lease_waiters WHERE name = 'job' AND holder = 'a'`).
				Scan(&got.since, &got.expiry); err != nil {
				return fmt.Errorf("the waiter's queue row: %w", err)
			}
			return fencelock.FenceSQLTx(ctx, tx, "job", token)
		})
	}()
	started := time.Now()
	awaitQueue(t, b.Ctx, b.Pool, "job", true, "a") // listening: between refreshes, only a wake-up ends its sleep
	t.Logf("queued and listening %v after the call", time.Since(started))
	expiry := func() (e time.Time) {
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT expires_at FROM fencelock.lease_waiters WHERE name = 'job' AND holder = 'a'`).Scan(&e))
		return e
	}
	first := expiry()
	for expiry().Equal(first) { // the next refresh: RunLockedLiveness/3 away
		time.Sleep(time.Millisecond)
		require.NoError(t, b.Ctx.Err())
	}
	released := time.Now()
	require.NoError(t, lease.Release(b.Ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("RunLockedSQL did not run within 10 s of the release (the holder's grant had a minute left)")
	}
	t.Logf("ran %v after the release", time.Since(released))
	require.Greater(t, got.token, lease.Token())
	last := got.expiry.Add(-timing.RunLockedLiveness) // the statement that set expires_at: now() + liveness
	return got.began.Sub(last), last.After(got.since)
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

// runLockedSQLCalls are the two calls that run fn under a transaction-scoped lease on a
// *sql.DB, for tests that run both alike.
var runLockedSQLCalls = []struct {
	name string
	run  func(l *fencelock.Lessor, ctx context.Context, sqlDB *sql.DB, name string, fn fencelock.SQLTxFunc) error
}{
	{"TryRunLockedSQL", (*fencelock.Lessor).TryRunLockedSQL},
	{"RunLockedSQL", (*fencelock.Lessor).RunLockedSQL},
}

// contextEnds are the two ways a caller's context ends, each with the error it then reports.
var contextEnds = []struct {
	name string
	ctx  func() (context.Context, func()) // a context, and what ends it
	want error
}{
	{"Cancelled", func() (context.Context, func()) { return context.WithCancel(context.Background()) }, context.Canceled},
	{"DeadlinePassed", newDeadlineContext, context.DeadlineExceeded},
}

// TryRunLockedSQL's doc (and RunLockedSQL's): when ctx ends while fn runs, the call returns
// ctx's error, wrapped with the driver's, once the transaction has ended. A statement that ctx
// ends reports ctx's error through pgx's stdlib (control), but only the server's cancellation
// through lib/pq ("pq: canceling statement due to user request", SQLSTATE 57014): the call must
// wrap ctx's error for both, whether ctx was cancelled or its deadline passed, and leave the
// lease free, its row unlocked, when it returns.
func TestLibpqRunLockedSQLEndedInFnWrapsContextError(t *testing.T) {
	t.Parallel()
	drivers := []struct{ name, driver string }{
		{"Libpq", "postgres"},
		{"PgxStdlibControl", "pgx"},
	}
	for _, c := range runLockedSQLCalls {
		for _, d := range drivers {
			for _, e := range contextEnds {
				t.Run(c.name+"/"+d.name+"/"+e.name, func(t *testing.T) {
					t.Parallel()
					b := setup(t)
					sqlDB := openSQLDB(t, d.driver, b.DB.URL)
					l := newLessor(t, b.Pool, "a")
					err := endWhile(t, b, e.ctx, "fn's statement runs", func(ctx context.Context) error {
						return c.run(l, ctx, sqlDB, "job", func(ctx context.Context, tx *sql.Tx, _ fencelock.Token) error {
							_, err := tx.ExecContext(ctx, `SELECT pg_sleep(10)`)
							return err
						})
					}, func() bool { return sleepsRunning(t, b, `SELECT pg_sleep(%`) == 1 })
					require.ErrorIs(t, err, e.want)
					require.Zero(t, sleepsRunning(t, b, `SELECT pg_sleep(%`), "fn's statement still runs after the call returned")
					requireLeaseFree(t, b, l, sqlDB, "job")
				})
			}
		}
	}
}

// TryRunLockedSQL's doc (and RunLockedSQL's), at the commit: when ctx ends while the COMMIT
// runs (a deferred constraint trigger holds it), lib/pq cancels it, and the call returns ctx's
// error wrapped with lib/pq's, with fn's write not committed and the lease free. (pgx's stdlib
// commits on a context of its own: the COMMIT runs to its end and succeeds.)
func TestLibpqRunLockedSQLEndedInCommitWrapsContextError(t *testing.T) {
	t.Parallel()
	for _, c := range runLockedSQLCalls {
		for _, e := range contextEnds {
			t.Run(c.name+"/"+e.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				_, err := b.Pool.Exec(b.Ctx, `CREATE TABLE work (id int PRIMARY KEY);
					CREATE FUNCTION slow_check() RETURNS trigger LANGUAGE plpgsql AS $$
						BEGIN PERFORM pg_sleep(10); RETURN NULL; END $$;
					CREATE CONSTRAINT TRIGGER slow_check AFTER INSERT ON work
						DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_check()`)
				require.NoError(t, err)
				sqlDB := openLibPQ(t, b)
				l := newLessor(t, b.Pool, "a")
				err = endWhile(t, b, e.ctx, "the COMMIT runs the deferred trigger", func(ctx context.Context) error {
					return c.run(l, ctx, sqlDB, "job", func(ctx context.Context, tx *sql.Tx, _ fencelock.Token) error {
						_, err := tx.ExecContext(ctx, `INSERT INTO work VALUES (1)`)
						return err
					})
				}, func() bool { return sleepsRunning(t, b, "COMMIT") == 1 })
				require.ErrorIs(t, err, e.want)
				var pqErr *pq.Error
				require.ErrorAs(t, err, &pqErr)
				require.Zero(t, sleepsRunning(t, b, "COMMIT"), "the COMMIT still runs after the call returned")
				var written int
				require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM work`).Scan(&written))
				require.Zero(t, written, "fn's write was committed")
				requireLeaseFree(t, b, l, sqlDB, "job")
			})
		}
	}
}

// endWhile runs call in a goroutine with a context that newCtx makes, ends that context once
// reached reports that the call got to the step under test (what), and returns the call's
// error. It fails the test when the call returns before, or not within 8 s of the end.
func endWhile(t *testing.T, b *bundle, newCtx func() (context.Context, func()), what string, call func(ctx context.Context) error, reached func() bool) error {
	t.Helper()
	ctx, end := newCtx()
	defer end()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	waitFor(t, b, what, func() bool {
		select {
		case err := <-done:
			t.Fatalf("returned before %s: %v", what, err)
		default:
		}
		return reached()
	})
	ended := time.Now()
	end()
	select {
	case err := <-done:
		t.Logf("returned %v after ctx ended: %v", time.Since(ended), err)
		return err
	case <-time.After(8 * time.Second):
		t.Fatal("no return within 8 s of ctx's end")
		return nil
	}
}

// sleepsRunning counts the backends of b's database whose statement is like query (a LIKE
// pattern) and sleeps in pg_sleep now.
func sleepsRunning(t *testing.T, b *bundle, query string) int {
	t.Helper()
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'active' AND wait_event = 'PgSleep' AND query LIKE $1`, query).Scan(&n))
	return n
}

// requireLeaseFree fails the test unless the lease row of name is unlocked and l runs fn under
// the lease at once (TryRunLockedSQL on sqlDB).
func requireLeaseFree(t *testing.T, b *bundle, l *fencelock.Lessor, sqlDB *sql.DB, name string) {
	t.Helper()
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	_, err = tx.Exec(b.Ctx, `SELECT FROM fencelock.leases WHERE name = $1 FOR UPDATE NOWAIT`, name)
	require.NoError(t, err, "the lease row is still locked")
	require.NoError(t, tx.Rollback(b.Ctx))
	var ran bool
	require.NoError(t, l.TryRunLockedSQL(b.Ctx, sqlDB, name, func(context.Context, *sql.Tx, fencelock.Token) error {
		ran = true
		return nil
	}), "the lease is not free")
	require.True(t, ran)
}

// deadlineContext is a context whose deadline passes when the test ends it rather than at a
// time: Done then closes and Err reports context.DeadlineExceeded, as for a
// context.WithDeadline whose time has come, at the moment the test chooses.
type deadlineContext struct {
	context.Context // no values, no deadline: context.Background()
	done            chan struct{}
}

// newDeadlineContext returns a deadlineContext and the func that makes its deadline pass.
func newDeadlineContext() (context.Context, func()) {
	c := &deadlineContext{Context: context.Background(), done: make(chan struct{})}
	var once sync.Once
	return c, func() { once.Do(func() { close(c.done) }) }
}

func (c *deadlineContext) Done() <-chan struct{} { return c.done }

func (c *deadlineContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
