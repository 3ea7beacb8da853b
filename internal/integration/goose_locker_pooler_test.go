package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/pressly/goose/v3/lock/locktesting"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/gooselock"
	"github.com/fencelock/fencelock/pgtest"
)

// The goose locker's tests behind PgBouncer (pgtest.NewPgBouncer), which only this module has;
// the rest of them, goose's contract tests on direct connections among them, live beside the
// package (gooselock/goose_locker_test.go). The helpers below are copies of that file's.

// gooseMigrations is the application's migration set of the goose tests: three tables, the
// second migration slow enough (200 ms) that concurrent migrators really overlap.
var gooseMigrations = fstest.MapFS{
	"00001_accounts.sql": {Data: []byte("-- +goose Up\nCREATE TABLE accounts (id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE accounts;\n")},
	"00002_orders.sql":   {Data: []byte("-- +goose Up\nCREATE TABLE orders (id bigint PRIMARY KEY);\nSELECT pg_sleep(0.2);\n-- +goose Down\nDROP TABLE orders;\n")},
	"00003_items.sql":    {Data: []byte("-- +goose Up\nCREATE TABLE items (id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE items;\n")},
}

// gooseVersionTable is the goose version table of the application in these tests.
const gooseVersionTable = "app_goose_version"

// goosePool returns a pool on url, closed at test cleanup; with execMode its connections use
// pgx.QueryExecModeExec (for a PgBouncer older than 1.21, see pgtest.PgBouncer).
func goosePool(t *testing.T, ctx context.Context, url string, execMode bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	if execMode {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newGooseProvider returns a goose Provider of fsys on a *sql.DB of pool (closed at test
// cleanup), locked by locker.
func newGooseProvider(t *testing.T, pool *pgxpool.Pool, fsys fstest.MapFS, locker lock.Locker) *goose.Provider {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(gooseVersionTable),
	)
	require.NoError(t, err)
	return p
}

// watchQueue records the longest queue of name seen in SQL, polling every 5 ms until stop is
// called (or the test ends), which returns it.
func watchQueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) (stop func() int) {
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

// providerLocking runs goose's own contract test, locktesting.TestProviderLocking: five
// migrators, each with its own lessor (holder id), its own pool on url and its own *sql.DB,
// run Up at once; exactly one applies the three migrations, the others wait for the lease
// and then find nothing pending. The migrators did overlap (some waited in the lease's queue),
// and each released its lease. To make sure they overlap, whatever the machine's load, an
// outside holder keeps the lease until two of them wait in its queue.
func providerLocking(t *testing.T, b *bundle, url string, execMode bool) {
	const name = "goose:app"
	var lockers []*gooselock.Locker
	blocker, err := newLessor(t, b.pool, "blocker").TryAcquire(b.ctx, name, 10*time.Second)
	require.NoError(t, err)
	go func() {
		defer func() { _ = blocker.Release(context.WithoutCancel(b.ctx)) }()
		for b.ctx.Err() == nil {
			var n int
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM fencelock.lease_queue WHERE name = $1`, name).Scan(&n); err != nil || n >= 2 {
				return
			}
			time.Sleep(5 * time.Millisecond) // polling the queue in SQL: there is no event to await
		}
	}()
	stop := watchQueue(t, b.ctx, b.pool, name)
	locktesting.TestProviderLocking(t, func(t *testing.T) *goose.Provider {
		pool := goosePool(t, b.ctx, url, execMode)
		l := newLessor(t, pool, fmt.Sprintf("migrator-%d", len(lockers)))
		locker, err := gooselock.New(l, name, 10*time.Second)
		require.NoError(t, err)
		lockers = append(lockers, locker)
		return newGooseProvider(t, pool, gooseMigrations, locker)
	})
	require.Positive(t, stop(), "no migrator waited for the lease: the test did not exercise the lock")
	for _, g := range lockers {
		require.ErrorIs(t, g.Err(), fencelock.ErrReleased)
	}
	var applied int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+gooseVersionTable+` WHERE version_id > 0`).Scan(&applied))
	require.Equal(t, 3, applied, "each migration is recorded once")
	var tables int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('accounts', 'orders', 'items')`).Scan(&tables))
	require.Equal(t, 3, tables)
}

// goose's contract test for lockers behind PgBouncer in transaction mode, where the lessors
// detect the pooler and their waiters poll: still one migrator applies everything (on direct
// connections: gooselock's TestGooseLockerProviderLocking).
func TestGooseLockerProviderLockingBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer := pgtest.NewPgBouncer(t, b.db.Server, "transaction")
	providerLocking(t, b, bouncer.URL(b.db.Name), !bouncer.PreparedStatements())
}

// concurrentLocking runs goose's other contract test, locktesting.TestConcurrentLocking: five
// gooselock.Lockers, each on a lessor of its own (its own holder id) on pool, Lock at once with a
// context that ends after a second; one gets the lease and holds it for two seconds, then
// calls Unlock with that same context, ended by then, which must succeed (goose's table
// locker passes: its Unlock detaches the context); the others give up when their context ends.
// Afterwards exactly one locker had the lease and released it, and the name is free at once:
// another lessor is granted it, and nothing is left in its queue.
func concurrentLocking(t *testing.T, b *bundle, pool *pgxpool.Pool) {
	const name = "goose:concurrent"
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	var lockers []*gooselock.Locker
	locktesting.TestConcurrentLocking(t, db, func(t *testing.T) lock.Locker {
		g, err := gooselock.New(newLessor(t, pool, fmt.Sprintf("locker-%d", len(lockers))), name, 10*time.Second)
		require.NoError(t, err)
		lockers = append(lockers, g)
		return g
	}, time.Second)
	released := 0
	for _, g := range lockers {
		if errors.Is(g.Err(), fencelock.ErrReleased) {
			released++
		} else {
			require.ErrorIs(t, g.Err(), fencelock.ErrNotHeld, "a locker that never held the lease")
		}
	}
	require.Equal(t, 1, released)
	require.Empty(t, readQueue(t, b.ctx, b.pool, name))
	lease, err := newLessor(t, pool, "after").TryAcquire(b.ctx, name, 10*time.Second)
	require.NoError(t, err, "the lease is still held after Unlock")
	require.NoError(t, lease.Release(b.ctx))
}

// goose's contract test for concurrent lockers behind PgBouncer in transaction mode, where the
// lessors poll (on direct connections: gooselock's TestGooseLockerConcurrentLocking).
func TestGooseLockerConcurrentLockingBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer := pgtest.NewPgBouncer(t, b.db.Server, "transaction")
	concurrentLocking(t, b, goosePool(t, b.ctx, bouncer.URL(b.db.Name), !bouncer.PreparedStatements()))
}

// goose's own session locker is not safe behind PgBouncer in transaction mode: its
// pg_try_advisory_lock runs as a transaction of its own, after which PgBouncer lends that
// server connection, lock and all, to the next client. Two migrators both "take" the lock,
// and both would run the migrations. The demonstration is deterministic: every statement
// through this PgBouncer runs one after the other, so PgBouncer never opens a second server
// connection and lends the same one to both clients, and in transaction mode it does not
// reset a session between clients (server_reset_query_always = 0). A gooselock.Locker behind the
// same PgBouncer excludes the second migrator.
func TestGooseLockerSessionLockerUnsafeBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer := pgtest.NewPgBouncer(t, b.db.Server, "transaction")
	url, execMode := bouncer.URL(b.db.Name), !bouncer.PreparedStatements()
	const lockID = 4242
	conns := make([]*sql.Conn, 2)
	for i := range conns {
		db := stdlib.OpenDBFromPool(goosePool(t, b.ctx, url, execMode))
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		c, err := db.Conn(b.ctx)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) })
		conns[i] = c
	}
	// A safe lock would refuse the second migrator: one try a second, for two seconds.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 2))
	require.NoError(t, err)
	require.NoError(t, locker.SessionLock(b.ctx, conns[0]))
	require.NoError(t, locker.SessionLock(b.ctx, conns[1]), "the second migrator was refused: the unsafe case did not show")
	// Both hold "the" lock: the same server session, which neither client owns, holds it twice.
	var holders []int32
	rows, err := b.pool.Query(b.ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = $1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, lockID)
	require.NoError(t, err)
	holders, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Len(t, holders, 1, "one server session holds the lock for both clients")
	require.NoError(t, locker.SessionUnlock(b.ctx, conns[0]))
	require.NoError(t, locker.SessionUnlock(b.ctx, conns[1]))

	// The gooselock.Locker behind the same PgBouncer: the second migrator waits until the first
	// unlocks.
	pool := goosePool(t, b.ctx, url, execMode)
	first, err := gooselock.New(newLessor(t, pool, "first"), "goose:app", 10*time.Second)
	require.NoError(t, err)
	second, err := gooselock.New(newLessor(t, pool, "second"), "goose:app", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, first.Lock(b.ctx, nil))
	wctx, cancel := context.WithTimeout(b.ctx, 500*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, second.Lock(wctx, nil), context.DeadlineExceeded)
	require.NoError(t, first.Unlock(b.ctx, nil))
	require.NoError(t, second.Lock(b.ctx, nil))
	require.NoError(t, second.Unlock(b.ctx, nil))
}
