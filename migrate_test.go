package fencelock_test

import (
	"context"
	"io/fs"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/migrations"
)

// An application that runs goose itself keeps its own version table untouched: fencelock's
// migrations keep theirs in fencelock.goose_db_version. Migrate is idempotent and safe to run
// from several processes at once.
func TestMigrateKeepsApplicationGooseTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Start from a database without fencelock's schema.
	_, err := b.Pool.Exec(b.Ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)

	// The application's own goose migrations, in its default table public.goose_db_version.
	appFS := fstest.MapFS{
		"00001_orders.sql": {Data: []byte("-- +goose Up\nCREATE TABLE orders (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE orders;\n")},
		"00002_items.sql":  {Data: []byte("-- +goose Up\nCREATE TABLE items (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE items;\n")},
	}
	db := stdlib.OpenDBFromPool(b.Pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, appFS, goose.WithLogger(goose.NopLogger()))
	require.NoError(t, err)
	_, err = p.Up(b.Ctx)
	require.NoError(t, err)
	appVersions := func() [][]any {
		rows, err := b.Pool.Query(b.Ctx, `SELECT version_id, is_applied FROM public.goose_db_version ORDER BY id`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		require.NoError(t, err)
		return got
	}
	before := appVersions()
	require.Len(t, before, 3) // goose's version 0 row, then 1 and 2

	// Several processes migrate at once; all succeed.
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- fencelock.Migrate(context.WithoutCancel(b.Ctx), b.Pool) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, fencelock.Migrate(b.Ctx, b.Pool)) // and again: nothing pending

	require.Equal(t, before, appVersions())
	var fencelockVersion int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT max(version_id) FROM fencelock.goose_db_version`).Scan(&fencelockVersion))
	sqlFiles, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.EqualValues(t, len(sqlFiles), fencelockVersion) // migrations are numbered 1..n
	cur, err := p.GetDBVersion(b.Ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, cur)

	// The schema works.
	l := newLessor(t, b.Pool, "a")
	lease, err := l.TryAcquire(b.Ctx, "job", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.Ctx))
}

// Migrate's lock differs from goose's default, so fencelock's migrations never wait on
// an application's own goose run holding its lock.
func TestMigrateDoesNotWaitForApplicationGooseLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Migrations pending: with nothing pending Migrate takes no lock at all.
	_, err := b.Pool.Exec(b.Ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	conn, _ := testkit.Conn(t, b.Ctx, b.Pool)
	_, err = conn.Exec(b.Ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(b.Ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID) }()
	// goose's lock stays held until the test ends: a Migrate that waited for it would never
	// return, so 60 s is a bound for a hang, not for the migrations' speed (under four busy
	// loops they outlasted 5 s).
	ctx, cancel := context.WithTimeout(b.Ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, fencelock.Migrate(ctx, b.Pool), "Migrate waited for goose's default lock")
}

// migrateWaiting reports whether a session of pool's database waits for Migrate's advisory lock.
func migrateWaiting(t *testing.T, b *bundle) bool {
	t.Helper()
	return testkit.MigrateWaiting(t, b.Ctx, b.Pool)
}

// Migrate with nothing pending takes no lock: it returns at once while a session holds the
// migration lock. With migrations pending it waits for that lock, and a session-level lock,
// which is what Migrate of earlier versions took (goose's session locker), excludes it: session
// and transaction advisory locks of one key are one lock in Postgres.
func TestMigrateWaitsForSessionLockOfEarlierVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, _ := testkit.Conn(t, b.Ctx, b.Pool)
	_, err := conn.Exec(b.Ctx, `SELECT pg_advisory_lock($1)`, migrateLockKey)
	require.NoError(t, err)
	locked := true
	defer func() {
		if locked {
			_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, migrateLockKey)
		}
	}()

	// The lock stays held: a Migrate that waited for it would not return, so 60 s is a bound
	// for a hang, not for the machine's speed.
	ctx, cancel := context.WithTimeout(b.Ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, fencelock.Migrate(ctx, b.Pool), "nothing pending: no lock")

	_, err = b.Pool.Exec(b.Ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	// awaitWaiting waits until the server shows a Migrate waiting for the lock, failing the
	// test if the Migrate (returned) returns first, or after a minute (a hang).
	awaitWaiting := func(returned <-chan error, what string) {
		t.Helper()
		hang := time.After(time.Minute)
		for !migrateWaiting(t, b) {
			select {
			case err := <-returned:
				t.Fatalf("%s returned while the session lock was held: %v", what, err)
			case <-hang:
				t.Fatalf("%s was not seen waiting for the session lock in a minute", what)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	// Bounded by ctx: the error says so, and nothing is left waiting. The ctx ends once the
	// Migrate is seen waiting for the lock (a timeout of 500 ms could end in its set-up on a
	// loaded machine, before the lock's wait).
	short, cancelShort := context.WithCancel(b.Ctx)
	defer cancelShort()
	gaveUp := testkit.Async(func() error { return fencelock.Migrate(short, b.Pool) })
	awaitWaiting(gaveUp, "the Migrate to cancel")
	cancelShort()
	err = testkit.Receive(t, gaveUp, time.Minute, "return of the cancelled Migrate (a hang)")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "migration lock")
	// The wait ends on the server too, once pgx's cancel request has reached it: 30 s is a
	// bound for a wait left there until the lock's own timeout (5 minutes).
	require.Eventually(t, func() bool { return !migrateWaiting(t, b) }, 30*time.Second, 10*time.Millisecond,
		"a Migrate that gave up still waits on the server")

	migrated := testkit.Async(func() error { return fencelock.Migrate(context.WithoutCancel(b.Ctx), b.Pool) })
	awaitWaiting(migrated, "Migrate")
	select {
	case err := <-migrated:
		t.Fatalf("Migrate returned while the session lock was held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	_, err = conn.Exec(b.Ctx, `SELECT pg_advisory_unlock($1)`, migrateLockKey)
	require.NoError(t, err)
	locked = false
	require.NoError(t, <-migrated)
	requireEachVersionOnce(t, b)
}

// Several Migrate calls on one small pool apply each migration once: the lock's connection is
// not the pool's, so calls that each hold a pooled connection (goose's) never wait for one
// another's (before, four calls on a pool of two could each hold one and wait for a second
// until ctx ended). Acquiring a connection takes 20 ms here, one round trip of a remote
// database, which widens the window between the two acquires of a call.
func TestMigrateConcurrentlyOnSmallPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = 2
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		time.Sleep(20 * time.Millisecond) // a round trip per acquire
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	ctx, cancel := context.WithTimeout(b.Ctx, time.Minute)
	defer cancel()
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- fencelock.Migrate(ctx, pool) }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	requireEachVersionOnce(t, b)
}
