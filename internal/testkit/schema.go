package testkit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/migrations"
)

// LeaseRow is a row of fencelock.leases as the database has it.
type LeaseRow struct {
	Holder  string
	Token   int64
	Expired bool
}

// ReadLease returns the row of lease name, failing the test if there is none.
func ReadLease(t testing.TB, ctx context.Context, pool *pgxpool.Pool, name string) LeaseRow {
	t.Helper()
	var r LeaseRow
	err := pool.QueryRow(ctx, `SELECT holder, token, expires_at <= clock_timestamp() FROM fencelock.leases WHERE name = $1`, name).
		Scan(&r.Holder, &r.Token, &r.Expired)
	require.NoError(t, err)
	return r
}

// Queued is one row of the view fencelock.lease_queue.
type Queued struct {
	Holder   string
	Position int64
	Notify   bool
}

// ReadQueue returns the live waiters of lease name in order, as the view fencelock.lease_queue
// shows them.
func ReadQueue(t testing.TB, ctx context.Context, pool *pgxpool.Pool, name string) []Queued {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT holder, position, woken_by_notify FROM fencelock.lease_queue WHERE name = $1 ORDER BY position`, name)
	require.NoError(t, err)
	q, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Queued, error) {
		var e Queued
		err := r.Scan(&e.Holder, &e.Position, &e.Notify)
		return e, err
	})
	require.NoError(t, err)
	return q
}

// AwaitQueue waits until the queue of lease name is exactly holders, in that order (and, with
// notify, each of them is woken by NOTIFY rather than polling), failing the test after 10 s.
func AwaitQueue(t testing.TB, ctx context.Context, pool *pgxpool.Pool, name string, notify bool, holders ...string) {
	t.Helper()
	await(t, 10*time.Second, 2*time.Millisecond, func() (bool, string) {
		q := ReadQueue(t, ctx, pool, name)
		got := make([]string, len(q))
		ok := len(q) == len(holders)
		for i, e := range q {
			got[i] = e.Holder
			ok = ok && e.Holder == holders[i] && e.Position == int64(i+1) && (!notify || e.Notify)
		}
		return ok, fmt.Sprintf("queue of %q is %v (%+v), want %v (notify %v)", name, got, q, holders, notify)
	})
}

// AwaitWaiters waits until the view fencelock.holders shows waiters waiters for lease name,
// failing the test after 10 s.
func AwaitWaiters(t testing.TB, ctx context.Context, pool *pgxpool.Pool, name string, waiters int64) {
	t.Helper()
	await(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT coalesce((SELECT waiters FROM fencelock.holders WHERE name = $1), -1)`, name).Scan(&n)
		require.NoError(t, err)
		return n == waiters, fmt.Sprintf("fencelock.holders shows %d waiters for %q, want %d", n, name, waiters)
	})
}

// AwaitPermitWaiters waits until holders are exactly the live waiters of semaphore sem, in
// queue order, failing the test after 10 s.
func AwaitPermitWaiters(t testing.TB, ctx context.Context, pool *pgxpool.Pool, sem string, holders ...string) {
	t.Helper()
	await(t, 10*time.Second, 2*time.Millisecond, func() (bool, string) {
		var got []string
		err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(holder ORDER BY seq), '{}') FROM fencelock.semaphore_waiters
			WHERE semaphore = $1 AND expires_at > clock_timestamp()`, sem).Scan(&got)
		require.NoError(t, err)
		return slices.Equal(got, holders), fmt.Sprintf("waiters of semaphore %q are %v, want %v", sem, got, holders)
	})
}

// WatchQueue records the longest queue of lease name seen in SQL, polling every 5 ms until
// stop is called (or the test ends), which returns it.
func WatchQueue(t testing.TB, ctx context.Context, pool *pgxpool.Pool, name string) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	longest := 0
	t.Cleanup(func() { cancel(); wg.Wait() }) // when the test fails before stop
	wg.Go(func() {
		for ctx.Err() == nil {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.lease_queue WHERE name = $1`, name).Scan(&n); err == nil {
				longest = max(longest, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	return func() int {
		cancel()
		wg.Wait()
		return longest
	}
}

// Listeners returns the backend pids of the database's listening connections.
func Listeners(t testing.TB, ctx context.Context, pool *pgxpool.Pool) []int32 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %' ORDER BY pid`)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// AdvisoryHolders lists the backend pids of the database that hold (granted) or wait for the
// advisory lock key.
func AdvisoryHolders(t testing.TB, ctx context.Context, pool *pgxpool.Pool, key int64, granted bool) []uint32 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted = $2
		  AND ((classid::bigint << 32) | objid::bigint) = $1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY pid`, key, granted)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	require.NoError(t, err)
	return pids
}

// RequireNothingHeld checks that refused grants left nothing behind: no live lease row with a
// token but those of names in granted, no flush row, no advisory lock in the database.
func RequireNothingHeld(t testing.TB, ctx context.Context, pool *pgxpool.Pool, granted ...string) {
	t.Helper()
	var leases, flushes, advisory int
	require.NoError(t, pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM fencelock.leases WHERE token > 0 AND name <> ALL ($1::text[]) AND expires_at > now()),
		(SELECT count(*) FROM fencelock.token_flushes),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`, granted).Scan(&leases, &flushes, &advisory))
	require.Zero(t, leases, "a refused grant left a lease held")
	require.Zero(t, flushes, "a refused advisory token left its flush row")
	require.Zero(t, advisory, "a refused advisory token left its lock held")
}

// MigrateLockKey is fencelock's migrateLockID, the advisory lock key of Migrate.
const MigrateLockKey int64 = 0x66656e63656c6f63

// MigrateWaiting reports whether a session of the database waits for Migrate's advisory lock.
func MigrateWaiting(t testing.TB, ctx context.Context, pool *pgxpool.Pool) bool {
	t.Helper()
	return len(AdvisoryHolders(t, ctx, pool, MigrateLockKey, false)) > 0
}

// RequireEachVersionOnce fails the test unless fencelock's version table lists every migration
// exactly once (and goose's version 0 once).
func RequireEachVersionOnce(t testing.TB, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT version_id FROM fencelock.goose_db_version WHERE is_applied ORDER BY version_id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	sqlFiles, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	want := []int64{0}
	for v := range len(sqlFiles) {
		want = append(want, int64(v+1)) // migrations are numbered 1..n
	}
	require.Equal(t, want, got)
}

// SQLState returns the SQLSTATE of err's Postgres error, or "" if the server reported none.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// BusiestPlanNode walks plan, the output of EXPLAIN (ANALYZE, FORMAT JSON) of one statement,
// and returns the largest number of rows a node handled (its actual rows times its loops)
// and that node's type and relation or CTE.
func BusiestPlanNode(plan []map[string]any) (rows float64, node string) {
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		work := n["Actual Rows"].(float64) * n["Actual Loops"].(float64)
		if work > rows {
			rows, node = work, fmt.Sprint(n["Node Type"], " ", n["Relation Name"], n["CTE Name"])
		}
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(plan[0]["Plan"].(map[string]any))
	return rows, node
}
