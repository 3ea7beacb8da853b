package fencelock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// grantPath is one way to take a free lease in one statement: Go's grant statements and the
// SQL API's grant functions (issue 38, item 5: one grant, dated the same way by all of them).
type grantPath struct {
	name string
	// grant takes lease name for holder "c" for ttl in one statement on pool (one
	// connection), through c (the lessor of holder "c" on pool) or in SQL, and returns the
	// grant's token and a func that releases it; a refusal is ErrNotAcquired.
	grant func(ctx context.Context, c *fencelock.Lessor, pool *pgxpool.Pool, name string, ttl time.Duration) (int64, func() error, error)
}

var grantPaths = []grantPath{
	{"TryAcquire", func(ctx context.Context, c *fencelock.Lessor, _ *pgxpool.Pool, name string, ttl time.Duration) (int64, func() error, error) {
		lease, err := c.TryAcquire(ctx, name, ttl)
		if err != nil {
			return 0, nil, err
		}
		return int64(lease.Token()), func() error { return lease.Release(ctx) }, nil
	}},
	{"TryAcquireAll", func(ctx context.Context, c *fencelock.Lessor, _ *pgxpool.Pool, name string, ttl time.Duration) (int64, func() error, error) {
		set, err := c.TryAcquireAll(ctx, []string{name}, ttl)
		if err != nil {
			return 0, nil, err
		}
		return int64(set.Lease(name).Token()), func() error { return set.Release(ctx) }, nil
	}},
	{"SQLTryAcquire", func(ctx context.Context, _ *fencelock.Lessor, pool *pgxpool.Pool, name string, ttl time.Duration) (int64, func() error, error) {
		var token int64
		err := pool.QueryRow(ctx, `SELECT coalesce(fencelock.try_acquire($1, 'c', $2), 0)`, name, ttl).Scan(&token)
		return sqlGranted(ctx, pool, name, token, err)
	}},
	{"SQLGrantAll", func(ctx context.Context, _ *fencelock.Lessor, pool *pgxpool.Pool, name string, ttl time.Duration) (int64, func() error, error) {
		var token int64
		err := pool.QueryRow(ctx, `SELECT g.token FROM fencelock.grant_all(ARRAY[$1::text], 'c', $2) AS g`,
			name, ttl.Microseconds()).Scan(&token)
		return sqlGranted(ctx, pool, name, token, err)
	}},
}

// sqlGranted is the result of an SQL grant of name to holder "c" as grantPath.grant returns
// it: token 0 (a refusal) is ErrNotAcquired; the release is fencelock.release.
func sqlGranted(ctx context.Context, pool *pgxpool.Pool, name string, token int64, err error) (int64, func() error, error) {
	if err != nil {
		return 0, nil, err
	}
	if token == 0 {
		return 0, nil, fencelock.ErrNotAcquired
	}
	return token, func() error {
		_, err := pool.Exec(ctx, `SELECT fencelock.release($1, 'c', $2)`, name, token)
		return err
	}, nil
}

// Every grant path dates a takeover as LeaseGrant does: from the end of the grant it replaces
// when its statement started before that end (acquired_at = greatest(start, the old
// expires_at)), with the TTL counted from there. The takeover's statement starts while the old
// grant is held and waits at a table lock (fencelock.leases, the first table each path reads);
// the lock's holder then ends the old grant (its expires_at set to the database clock's now),
// waits until it is past on the database clock and commits: the takeover goes on and finds the
// lease free. Dated from its statement's or transaction's start, as fencelock.try_acquire and
// fencelock.grant_all were until migration 00017, the takeover began up to the wait before
// the old grant ended. This table is the test that fails when the SQL API's grants and Go's
// drift apart.
func TestEveryGrantPathStartsAfterTheGrantItReplaces(t *testing.T) {
	t.Parallel()
	for _, p := range grantPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := b.Ctx
			a := newLessor(t, b.Pool, "a", fencelock.WithoutHeartbeat())
			old, err := a.TryAcquire(ctx, "job", time.Minute)
			require.NoError(t, err)
			// One connection, on which a refused grant has prepared the statement: the
			// takeover then waits in its own statement's transaction, not in a preparation's
			// that runs before it.
			pool := testkit.NewPool(t, ctx, b.DB.URL, testkit.MaxConns(1))
			c := newLessor(t, pool, "c")
			_, _, err = p.grant(ctx, c, pool, "job", time.Minute)
			require.ErrorIs(t, err, fencelock.ErrNotAcquired)
			var pid uint32
			require.NoError(t, pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))

			lock, err := b.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = lock.Rollback(ctx) }()
			_, err = lock.Exec(ctx, `LOCK TABLE fencelock.leases IN ACCESS EXCLUSIVE MODE`)
			require.NoError(t, err)
			type result struct {
				token   int64
				release func() error
				err     error
			}
			got := testkit.Async(func() result {
				token, release, err := p.grant(ctx, c, pool, "job", time.Minute)
				return result{token, release, err}
			})
			began := awaitLeasesLockWait(t, b, pid)
			// The old grant ends now, while the takeover waits: after its statement began,
			// whatever the machine's speed.
			var oldEnd time.Time
			require.NoError(t, lock.QueryRow(ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp()
				WHERE name = 'job' RETURNING expires_at`).Scan(&oldEnd))
			require.True(t, began.Before(oldEnd), "staging: the takeover's transaction began at %v, not before the old grant's end at %v", began, oldEnd)
			waitFor(t, b, "the old grant expires on the database clock", func() bool {
				var past bool
				err := b.Pool.QueryRow(ctx, `SELECT clock_timestamp() > $1`, oldEnd).Scan(&past)
				return err == nil && past
			})
			require.NoError(t, lock.Commit(ctx))

			r := testkit.Receive(t, got, 10*time.Second, "takeover")
			require.NoError(t, r.err)
			require.Greater(t, r.token, int64(old.Token()))
			var token int64
			var start, end time.Time
			require.NoError(t, b.Pool.QueryRow(ctx, `SELECT token, acquired_at, expires_at FROM fencelock.leases WHERE name = 'job'`).
				Scan(&token, &start, &end))
			require.Equal(t, r.token, token)
			require.False(t, start.Before(oldEnd), "the takeover is dated %v before the grant it replaced ended (at %v; its transaction began %v before)",
				oldEnd.Sub(start), oldEnd, oldEnd.Sub(began))
			require.Equal(t, time.Minute, end.Sub(start), "the TTL counts from the grant's start")
			require.NoError(t, r.release())
		})
	}
}

// awaitLeasesLockWait waits until backend pid of b's database waits for a lock on
// fencelock.leases (pg_locks, not granted), failing the test after 10 s; it returns the start
// of the backend's transaction (pg_stat_activity.xact_start).
func awaitLeasesLockWait(t *testing.T, b *bundle, pid uint32) time.Time {
	t.Helper()
	var began time.Time
	require.Eventually(t, func() bool {
		err := b.Pool.QueryRow(b.Ctx, `SELECT a.xact_start FROM pg_catalog.pg_stat_activity AS a
			WHERE a.pid = $1 AND a.datname = current_database() AND a.wait_event_type = 'Lock'
			  AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS k
			              WHERE k.pid = a.pid AND NOT k.granted AND k.locktype = 'relation'
			                AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
			                AND k.relation = 'fencelock.leases'::regclass)`, pid).Scan(&began)
		return err == nil
	}, 10*time.Second, 2*time.Millisecond, "backend %d does not wait for a lock on fencelock.leases", pid)
	return began
}
