package integration

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/gooselock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// The goose locker's tests behind PgBouncer (pgtest.NewPgBouncer), which only this module has;
// the rest of them, goose's contract tests on direct connections among them, live beside the
// package (gooselock/goose_locker_test.go). Both run goose's contract tests through
// internal/testkit/fencetest.

// gooseMigrations are the application's migrations of the goose tests, kept in the version
// table gooseVersionTable; newGooseProvider returns a goose provider of a migration set on a
// pool, locked by a locker; watchQueue records the longest queue of a lease until stopped.
var (
	gooseMigrations  = fencetest.GooseMigrations
	newGooseProvider = fencetest.NewGooseProvider
	watchQueue       = testkit.WatchQueue
)

const gooseVersionTable = fencetest.GooseVersionTable

// providerLocking runs goose's own contract test, locktesting.TestProviderLocking, on
// gooselock.Lockers, each migrator with its own pool on url (goosePool, with execMode)
// (fencetest.GooseProviderLocking).
func providerLocking(t *testing.T, b *bundle, url string, execMode bool) {
	fencetest.GooseProviderLocking(t, b.Ctx, b.Pool, func(t *testing.T) *pgxpool.Pool { return goosePool(t, b.Ctx, url, execMode) }, gooselock.New)
}

// goose's contract test for lockers behind PgBouncer in transaction mode, where the lessors
// detect the pooler and their waiters poll: still one migrator applies everything (on direct
// connections: gooselock's TestGooseLockerProviderLocking).
func TestGooseLockerProviderLockingBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer := pgtest.NewPgBouncer(t, b.DB.Server, "transaction")
	providerLocking(t, b, bouncer.URL(b.DB.Name), !bouncer.PreparedStatements())
}

// concurrentLocking runs goose's other contract test, locktesting.TestConcurrentLocking, on
// gooselock.Lockers on pool (fencetest.GooseConcurrentLocking).
func concurrentLocking(t *testing.T, b *bundle, pool *pgxpool.Pool) {
	fencetest.GooseConcurrentLocking(t, b.Ctx, b.Pool, pool, gooselock.New)
}

// goose's contract test for concurrent lockers behind PgBouncer in transaction mode, where the
// lessors poll (on direct connections: gooselock's TestGooseLockerConcurrentLocking).
func TestGooseLockerConcurrentLockingBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, pool := viaPgBouncer(t, b, "transaction")
	concurrentLocking(t, b, pool)
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
	bouncer := pgtest.NewPgBouncer(t, b.DB.Server, "transaction")
	url, execMode := bouncer.URL(b.DB.Name), !bouncer.PreparedStatements()
	const lockID = 4242
	conns := make([]*sql.Conn, 2)
	for i := range conns {
		db := stdlib.OpenDBFromPool(goosePool(t, b.Ctx, url, execMode))
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		c, err := db.Conn(b.Ctx)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) })
		conns[i] = c
	}
	// A safe lock would refuse the second migrator: one try a second, for two seconds.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 2))
	require.NoError(t, err)
	require.NoError(t, locker.SessionLock(b.Ctx, conns[0]))
	require.NoError(t, locker.SessionLock(b.Ctx, conns[1]), "the second migrator was refused: the unsafe case did not show")
	// Both hold "the" lock: the same server session, which neither client owns, holds it twice.
	var holders []int32
	rows, err := b.Pool.Query(b.Ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = $1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, lockID)
	require.NoError(t, err)
	holders, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Len(t, holders, 1, "one server session holds the lock for both clients")
	require.NoError(t, locker.SessionUnlock(b.Ctx, conns[0]))
	require.NoError(t, locker.SessionUnlock(b.Ctx, conns[1]))

	// The gooselock.Locker behind the same PgBouncer: the second migrator waits until the first
	// unlocks.
	pool := goosePool(t, b.Ctx, url, execMode)
	first, err := gooselock.New(newLessor(t, pool, "first"), "goose:app", 10*time.Second)
	require.NoError(t, err)
	second, err := gooselock.New(newLessor(t, pool, "second"), "goose:app", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, first.Lock(b.Ctx, nil))
	wctx, cancel := context.WithTimeout(b.Ctx, 500*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, second.Lock(wctx, nil), context.DeadlineExceeded)
	require.NoError(t, first.Unlock(b.Ctx, nil))
	require.NoError(t, second.Lock(b.Ctx, nil))
	require.NoError(t, second.Unlock(b.Ctx, nil))
}
