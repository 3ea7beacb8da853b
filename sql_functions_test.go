package fencelock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// The SQL API of migration 00014 (docs/SQL.md), called as a worker in another language calls
// it: plain statements, no Go lessor on that side.

// sqlState returns the SQLSTATE of err's Postgres error ("" for none).
var sqlState = testkit.SQLState

// sqlTryAcquire calls fencelock.try_acquire; 0 when it returned NULL (not acquired).
func sqlTryAcquire(t *testing.T, b *bundle, name, holder string, ttl time.Duration) fencelock.Token {
	t.Helper()
	var tok *int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.try_acquire($1, $2, $3)`, name, holder, ttl).Scan(&tok))
	if tok == nil {
		return 0
	}
	require.Greater(t, *tok, int64(0))
	return fencelock.Token(*tok)
}

func TestSQLLeaseLifeCycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t1 := sqlTryAcquire(t, b, "acct:1", "py-1", time.Minute)
	require.NotZero(t, t1)
	require.Zero(t, sqlTryAcquire(t, b, "acct:1", "py-2", time.Minute), "a held lease is refused")
	row := readLease(t, b.Ctx, b.Pool, "acct:1")
	require.Equal(t, leaseRow{Holder: "py-1", Token: int64(t1)}, row)

	var first, second time.Time
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.renew('acct:1', 'py-1', $1, interval '1 minute')`, int64(t1)).Scan(&first))
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.renew('acct:1', 'py-1', $1, interval '2 minutes')`, int64(t1)).Scan(&second))
	require.True(t, second.After(first), "a renewal extends the lease")
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.renew('acct:1', 'py-1', $1, interval '10 seconds')`, int64(t1)).Scan(&first))
	require.Equal(t, second, first, "the expiry never moves back")

	var exp time.Time
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.guard_lease('acct:1', 'py-1', $1)`, int64(t1)).Scan(&exp))
	require.Equal(t, second, exp)

	var released bool
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.release('acct:1', 'py-1', $1)`, int64(t1)).Scan(&released))
	require.True(t, released)
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.release('acct:1', 'py-1', $1)`, int64(t1)).Scan(&released))
	require.False(t, released, "a second release finds nothing to release")

	for _, call := range []string{
		`SELECT fencelock.renew('acct:1', 'py-1', $1, interval '1 minute')`,
		`SELECT fencelock.guard_lease('acct:1', 'py-1', $1)`,
		`SELECT fencelock.fence_lease('acct:1', 'py-1', $1, 'acct:1')`,
	} {
		_, err := b.Pool.Exec(b.Ctx, call, int64(t1))
		require.Equal(t, "FL005", sqlState(err), call)
		require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrLeaseLost, call)
	}

	t2 := sqlTryAcquire(t, b, "acct:1", "py-2", time.Minute)
	require.Greater(t, t2, t1, "the next grant's token is larger")
}

func TestSQLFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fence := func(token int64) error {
		return pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.Ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
			var got int64
			if err := tx.QueryRow(b.Ctx, `SELECT fencelock.fence('r', $1)`, token).Scan(&got); err != nil {
				return err
			}
			if got != token {
				return errors.New("fence returned another token")
			}
			var sync string
			if err := tx.QueryRow(b.Ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sync); err != nil {
				return err
			}
			if sync != "on" {
				return errors.New("fence left synchronous_commit " + sync)
			}
			return nil
		})
	}
	require.NoError(t, fence(5))
	require.NoError(t, fence(5), "equal tokens pass")
	err := fence(3)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "FL004", pgErr.Code)
	require.Equal(t, "current=5", pgErr.Detail)
	require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrStaleToken)
	require.NoError(t, fence(7))
	// A token the SQL API fenced is as good as one a Go call fenced, and the other way round.
	require.ErrorIs(t, fenceOnly(b.Ctx, b.Pool, "r", 6), fencelock.ErrStaleToken)
	require.NoError(t, fenceOnly(b.Ctx, b.Pool, "r", 8))
	require.Equal(t, "FL004", sqlState(fence(7)))
}

// fenceOnly advances resource's fence to token through the Go API, in a transaction of its own.
var fenceOnly = fencetest.FenceOnly

// A holder of the SQL API and a Go lessor exclude each other on one name, and fence each
// other's stale writes.
func TestSQLLeaseAndGoLessor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "go-1", fastBackoff)
	goLease, err := l.TryAcquire(b.Ctx, "acct:7", time.Minute)
	require.NoError(t, err)
	require.Zero(t, sqlTryAcquire(t, b, "acct:7", "py-1", time.Minute), "the SQL API does not take a Go holder's lease")
	require.NoError(t, goLease.Release(b.Ctx))

	pyToken := sqlTryAcquire(t, b, "acct:7", "py-1", time.Minute)
	require.Greater(t, pyToken, goLease.Token())
	_, err = l.TryAcquire(b.Ctx, "acct:7", time.Minute)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired, "the Go lessor does not take the SQL holder's lease")
	_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.fence_lease('acct:7', 'py-1', $1, 'acct:7')`, int64(pyToken))
	require.NoError(t, err)
	// The Go lessor's old token is stale at the fence the SQL holder advanced.
	require.ErrorIs(t, fenceOnly(b.Ctx, b.Pool, "acct:7", goLease.Token()), fencelock.ErrStaleToken)

	// A waiting Go Acquire gets the lease handed over by the SQL release.
	got := fencetest.AcquireAsync(b.Ctx, l, "acct:7", time.Minute)
	awaitWaiters(t, b, "acct:7", 1)
	var released bool
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT fencelock.release('acct:7', 'py-1', $1)`, int64(pyToken)).Scan(&released))
	require.True(t, released)
	a := <-got
	require.NoError(t, a.Err)
	require.Greater(t, a.Lease.Token(), pyToken)
	require.NoError(t, a.Lease.FenceTx(b.Ctx, mustBegin(t, b), "acct:7"))

	// Now the SQL holder is the stale one.
	_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.fence_lease('acct:7', 'py-1', $1, 'acct:7')`, int64(pyToken))
	require.Equal(t, "FL005", sqlState(err))
}

// mustBegin begins a transaction on b's pool, committed at test cleanup.
func mustBegin(t *testing.T, b *bundle) pgx.Tx {
	t.Helper()
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Commit(context.Background()) })
	return tx
}

// The SQL API refuses bad input with FL007 before it reads or writes anything.
func TestSQLInvalidArguments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := make([]byte, fencelock.MaxNameLength+1)
	for i := range long {
		long[i] = 'x'
	}
	for _, c := range []struct {
		desc string
		sql  string
		args []any
	}{
		{"EmptyName", `SELECT fencelock.try_acquire('', 'h', interval '1 minute')`, nil},
		{"LongName", `SELECT fencelock.try_acquire($1, 'h', interval '1 minute')`, []any{string(long)}},
		{"NullHolder", `SELECT fencelock.try_acquire('n', NULL, interval '1 minute')`, nil},
		{"ShortTTL", `SELECT fencelock.try_acquire('n', 'h', interval '1 millisecond')`, nil},
		{"LongTTL", `SELECT fencelock.try_acquire('n', 'h', interval '8 days')`, nil},
		{"RenewZeroToken", `SELECT fencelock.renew('n', 'h', 0, interval '1 minute')`, nil},
		{"ReleaseNegativeToken", `SELECT fencelock.release('n', 'h', -1)`, nil},
		{"GuardEmptyHolder", `SELECT fencelock.guard_lease('n', '', 1)`, nil},
		{"FenceZeroToken", `SELECT fencelock.fence('r', 0)`, nil},
		{"FenceEmptyResource", `SELECT fencelock.fence('', 1)`, nil},
		{"SetTokenZero", `SELECT fencelock.set_token(0)`, nil},
	} {
		t.Run(c.desc, func(t *testing.T) {
			_, err := b.Pool.Exec(b.Ctx, c.sql, c.args...)
			require.Equal(t, "FL007", sqlState(err), "%v", err)
			require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrInvalidArgument)
		})
	}
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT (SELECT count(*) FROM fencelock.leases) + (SELECT count(*) FROM fencelock.fences)`).Scan(&n))
	require.Zero(t, n, "a refused call wrote something")
}
