package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/pgtest"
)

// Migrate behind PgBouncer in transaction mode. The tests of Migrate that need only a server
// are in the root package (migrate_test.go).

// Migrate's lock excludes concurrent Migrate calls behind PgBouncer in transaction mode too (a
// session advisory lock would stay on whichever server connection took it, pressly/goose#972):
// four processes, each with a pool of its own through PgBouncer, migrate a database without
// fencelock's schema at once; each migration is applied once.
func TestMigrateConcurrentlyBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	bouncer := pgtest.NewPgBouncer(t, b.DB.Server, "transaction")
	url, execMode := bouncer.URL(b.DB.Name), !bouncer.PreparedStatements()

	pools := make([]*pgxpool.Pool, 4)
	for i := range pools {
		pools[i] = goosePool(t, b.Ctx, url, execMode)
	}
	errs := make(chan error, len(pools))
	for _, pool := range pools {
		go func() { errs <- fencelock.Migrate(context.WithoutCancel(b.Ctx), pool) }()
	}
	for range pools {
		require.NoError(t, <-errs)
	}
	requireEachVersionOnce(t, b)
	require.NoError(t, fencelock.Migrate(b.Ctx, pools[0])) // nothing pending

	// The schema works through PgBouncer.
	l := newLessor(t, pools[0], "a")
	lease, err := l.TryAcquire(b.Ctx, "job", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.Ctx))
}

// Behind PgBouncer in transaction mode, Migrate's lock stays held while a migration runs: a
// second Migrate through the same PgBouncer waits for it, then finds nothing pending. The first
// is held up in migration 00005 (its ALTER TABLE waits for an owner's transaction that holds
// fencelock.leases) for longer than the database's idle_in_transaction_session_timeout, while
// the lock's transaction sits idle on its server connection: the lock's transaction turns that
// timeout off for itself.
func TestMigrateLockHeldAcrossMigrationBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := gooseProvider(t, b.Pool).DownTo(b.Ctx, 4)
	require.NoError(t, err)
	const idleTimeout = 500 * time.Millisecond
	_, err = b.Pool.Exec(b.Ctx, fmt.Sprintf(`ALTER DATABASE %s SET idle_in_transaction_session_timeout = %d`,
		pgx.Identifier{b.DB.Name}.Sanitize(), idleTimeout.Milliseconds()))
	require.NoError(t, err)
	bouncer := pgtest.NewPgBouncer(t, b.DB.Server, "transaction") // its server sessions start now
	url, execMode := bouncer.URL(b.DB.Name), !bouncer.PreparedStatements()

	hold, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer hold.Rollback(context.Background())
	_, err = hold.Exec(b.Ctx, `SET LOCAL idle_in_transaction_session_timeout = 0; LOCK TABLE fencelock.leases IN ACCESS SHARE MODE`)
	require.NoError(t, err)
	locked := time.Now()

	poolA, poolB := goosePool(t, b.Ctx, url, execMode), goosePool(t, b.Ctx, url, execMode)
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- fencelock.Migrate(context.WithoutCancel(b.Ctx), poolA) }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND relation = 'fencelock.leases'::regclass
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the first Migrate did not reach migration 00005")
	go func() { second <- fencelock.Migrate(context.WithoutCancel(b.Ctx), poolB) }()
	require.Eventually(t, func() bool { return migrateWaiting(t, b) }, 10*time.Second, 5*time.Millisecond,
		"the second Migrate did not wait for the first's lock")
	select {
	case err := <-second:
		t.Fatalf("the second Migrate returned while the first held the lock: %v", err)
	case <-time.After(time.Until(locked.Add(2 * idleTimeout))):
	}
	var migrating int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'fencelock.leases'::regclass
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&migrating))
	require.Equal(t, 1, migrating, "both Migrate calls run migration 00005")
	// Migrate of earlier versions (goose's session locker, pg_try_advisory_lock on the same key)
	// is refused too: session and transaction advisory locks of one key are one lock.
	conn, err := b.Pool.Acquire(b.Ctx)
	require.NoError(t, err)
	defer conn.Release()
	var took bool
	require.NoError(t, conn.QueryRow(b.Ctx, `SELECT pg_try_advisory_lock($1)`, migrateLockKey).Scan(&took))
	if took {
		_, _ = conn.Exec(b.Ctx, `SELECT pg_advisory_unlock($1)`, migrateLockKey)
	}
	require.False(t, took, "a session lock was granted while Migrate held its lock")
	require.NoError(t, hold.Commit(b.Ctx))
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	requireEachVersionOnce(t, b)
}

// migrateLockKey is fencelock's migrateLockID, the advisory lock key of Migrate.
const migrateLockKey = testkit.MigrateLockKey

// migrateWaiting reports whether a session of pool's database waits for Migrate's advisory lock.
func migrateWaiting(t *testing.T, b *bundle) bool {
	t.Helper()
	return testkit.MigrateWaiting(t, b.Ctx, b.Pool)
}

// requireEachVersionOnce fails the test unless fencelock's version table lists every migration
// exactly once (and goose's version 0 once).
func requireEachVersionOnce(t *testing.T, b *bundle) {
	t.Helper()
	testkit.RequireEachVersionOnce(t, b.Ctx, b.Pool)
}
