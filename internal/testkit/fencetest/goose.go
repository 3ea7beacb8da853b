package fencetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/pressly/goose/v3/lock/locktesting"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/migrations"
)

// GooseProvider returns a goose provider for fencelock's migrations on pool, as Migrate has
// it: fencelock's version table, no global registry, no logging. Its *sql.DB is closed at
// test cleanup.
func GooseProvider(t testing.TB, pool *pgxpool.Pool) *goose.Provider {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(fencelock.VersionTable), goose.WithDisableGlobalRegistry(true), goose.WithLogger(goose.NopLogger()))
	require.NoError(t, err)
	return p
}

// GooseMigrations is the application's migration set of the goose locker's tests: three
// tables, the second migration slow enough (200 ms) that concurrent migrators really overlap.
var GooseMigrations = fstest.MapFS{
	"00001_accounts.sql": {Data: []byte("-- +goose Up\nCREATE TABLE accounts (id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE accounts;\n")},
	"00002_orders.sql":   {Data: []byte("-- +goose Up\nCREATE TABLE orders (id bigint PRIMARY KEY);\nSELECT pg_sleep(0.2);\n-- +goose Down\nDROP TABLE orders;\n")},
	"00003_items.sql":    {Data: []byte("-- +goose Up\nCREATE TABLE items (id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE items;\n")},
}

// GooseVersionTable is the goose version table of the application in the goose locker's tests.
const GooseVersionTable = "app_goose_version"

// NewGooseProvider returns a goose provider of fsys on a *sql.DB of pool (closed at test
// cleanup), locked by locker, with the version table [GooseVersionTable].
func NewGooseProvider(t testing.TB, pool *pgxpool.Pool, fsys fstest.MapFS, locker lock.Locker) *goose.Provider {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(GooseVersionTable),
	)
	require.NoError(t, err)
	return p
}

// GooseLocker is what the goose contract tests below need of a locker on a lease: goose's
// lock.Locker, and Err as gooselock.Locker has it. (This package does not import gooselock,
// whose internal tests use it; its tests pass gooselock.New.)
type GooseLocker interface {
	lock.Locker
	Err() error
}

// GooseProviderLocking runs goose's own contract test, locktesting.TestProviderLocking: five
// migrators, each with its own lessor (holder id) and locker from newLocker, its own pool from
// newPool and its own *sql.DB, run Up of [GooseMigrations] at once; exactly one applies the
// three migrations, the others wait for the lease and then find nothing pending. The
// migrators did overlap (some waited in the lease's queue), and each released its lease. To
// make sure they overlap, whatever the machine's load, an outside holder keeps the lease until
// two of them wait in its queue. ctx and pool are the test's own, on the same database.
func GooseProviderLocking[L GooseLocker](t *testing.T, ctx context.Context, pool *pgxpool.Pool,
	newPool func(t *testing.T) *pgxpool.Pool, newLocker func(*fencelock.Lessor, string, time.Duration) (L, error)) {
	const name = "goose:app"
	var lockers []L
	blocker, err := NewLessor(t, pool, "blocker").TryAcquire(ctx, name, 10*time.Second)
	require.NoError(t, err)
	go func() {
		defer func() { _ = blocker.Release(context.WithoutCancel(ctx)) }()
		for ctx.Err() == nil {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM fencelock.lease_queue WHERE name = $1`, name).Scan(&n); err != nil || n >= 2 {
				return
			}
			time.Sleep(5 * time.Millisecond) // polling the queue in SQL: there is no event to await
		}
	}()
	stop := testkit.WatchQueue(t, ctx, pool, name)
	locktesting.TestProviderLocking(t, func(t *testing.T) *goose.Provider {
		p := newPool(t)
		locker, err := newLocker(NewLessor(t, p, fmt.Sprintf("migrator-%d", len(lockers))), name, 10*time.Second)
		require.NoError(t, err)
		lockers = append(lockers, locker)
		return NewGooseProvider(t, p, GooseMigrations, locker)
	})
	require.Positive(t, stop(), "no migrator waited for the lease: the test did not exercise the lock")
	for _, g := range lockers {
		require.ErrorIs(t, g.Err(), fencelock.ErrReleased)
	}
	var applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+GooseVersionTable+` WHERE version_id > 0`).Scan(&applied))
	require.Equal(t, 3, applied, "each migration is recorded once")
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('accounts', 'orders', 'items')`).Scan(&tables))
	require.Equal(t, 3, tables)
}

// GooseConcurrentLocking runs goose's other contract test, locktesting.TestConcurrentLocking:
// five lockers from newLocker, each on a lessor of its own (its own holder id) on lockPool,
// Lock at once with a context that ends after two seconds (one, goose's own choice, left a
// loaded machine no time for any grant: locktesting's bound on the whole run, lockTimeout + 5 s,
// must also cover the holder's 2 x lockTimeout, so 2 s is the most it allows with room); one
// gets the lease and holds it for four seconds, then calls Unlock with that same context, ended
// by then, which must succeed
// (goose's table locker passes: its Unlock detaches the context); the others give up when
// their context ends. Afterwards exactly one locker had the lease and released it, and the
// name is free at once: another lessor is granted it, and nothing is left in its queue, as
// ctx and pool, the test's own on the same database, see it.
func GooseConcurrentLocking[L GooseLocker](t *testing.T, ctx context.Context, pool, lockPool *pgxpool.Pool,
	newLocker func(*fencelock.Lessor, string, time.Duration) (L, error)) {
	const name = "goose:concurrent"
	db := stdlib.OpenDBFromPool(lockPool)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	// The lockers' connections opened before the race: dialling is not what the test judges.
	var warm []*pgxpool.Conn
	for range min(6, int(lockPool.Config().MaxConns)) { // five lockers and the test's db
		c, err := lockPool.Acquire(ctx)
		require.NoError(t, err)
		warm = append(warm, c)
	}
	for _, c := range warm {
		c.Release()
	}
	var lockers []L
	locktesting.TestConcurrentLocking(t, db, func(t *testing.T) lock.Locker {
		g, err := newLocker(NewLessor(t, lockPool, fmt.Sprintf("locker-%d", len(lockers))), name, 10*time.Second)
		require.NoError(t, err)
		lockers = append(lockers, g)
		return g
	}, 2*time.Second)
	released := 0
	for _, g := range lockers {
		if errors.Is(g.Err(), fencelock.ErrReleased) {
			released++
		} else {
			require.ErrorIs(t, g.Err(), fencelock.ErrNotHeld, "a locker that never held the lease")
		}
	}
	require.Equal(t, 1, released)
	require.Empty(t, testkit.ReadQueue(t, ctx, pool, name))
	lease, err := NewLessor(t, lockPool, "after").TryAcquire(ctx, name, 10*time.Second)
	require.NoError(t, err, "the lease is still held after Unlock")
	require.NoError(t, lease.Release(ctx))
}
