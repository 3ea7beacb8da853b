package gooselock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	"github.com/fencelock/fencelock/gooselock"
)

// gooseMigrations is the application's migration set of the goose tests: three tables, the
// second migration slow enough (200 ms) that concurrent migrators really overlap.
var gooseMigrations = fstest.MapFS{
	"00001_accounts.sql": {Data: []byte("-- +goose Up\nCREATE TABLE accounts (id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE accounts;\n")},
	"00002_orders.sql":   {Data: []byte("-- +goose Up\nCREATE TABLE orders (id bigint PRIMARY KEY);\nSELECT pg_sleep(0.2);\n-- +goose Down\nDROP TABLE orders;\n")},
	"00003_items.sql":    {Data: []byte("-- +goose Up\nCREATE TABLE items (id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE items;\n")},
}

// gooseVersionTable is the goose version table of the application in these tests.
const gooseVersionTable = "app_goose_version"

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
func providerLocking(t *testing.T, b *bundle, url string) {
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
		pool := newPool(t, b.ctx, url)
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

// goose's contract test for lockers, on direct connections: one migrator applies everything.
func TestGooseLockerProviderLocking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	providerLocking(t, b, b.db.URL)
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

// goose's contract test for concurrent lockers, on direct connections.
func TestGooseLockerConcurrentLocking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	concurrentLocking(t, b, b.pool)
}

// A lease lost while locked (no heartbeat, TTL 1 s): Done closes at the end of the trust
// window, Err and the cause of a context from Context match ErrLeaseLost, and Unlock reports
// the loss (ErrNotHeld and ErrLeaseLost) while releasing what is left; the locker can lock again.
func TestGooseLockerLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, err := gooselock.New(newLessor(t, b.pool, "lost", fencelock.WithoutHeartbeat()), "goose:lost", time.Second)
	require.NoError(t, err)
	ctx, cancel := g.Context(b.ctx)
	defer cancel()
	require.NoError(t, g.Lock(b.ctx, nil))
	require.NoError(t, g.Err())
	select {
	case <-g.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed within 10 s of a 1 s lease without heartbeat")
	}
	require.ErrorIs(t, g.Err(), fencelock.ErrLeaseLost)
	var lost *fencelock.LeaseLostError
	require.ErrorAs(t, g.Err(), &lost)
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the context of Context was not cancelled within 5 s of the loss")
	}
	require.ErrorIs(t, context.Cause(ctx), fencelock.ErrLeaseLost)

	err = g.Unlock(b.ctx, nil)
	require.ErrorIs(t, err, fencelock.ErrNotHeld)
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	require.ErrorIs(t, g.Err(), fencelock.ErrLeaseLost, "Err keeps the loss after Unlock")

	require.NoError(t, g.Lock(b.ctx, nil))
	require.NoError(t, g.Unlock(b.ctx, nil))
	require.ErrorIs(t, g.Err(), fencelock.ErrReleased)
}

// A context from Context, passed to goose's Up, cancels the run when the lease is lost: the
// slow migration in flight is rolled back instead of running on without the lease, and Up
// fails with the loss.
func TestGooseLockerContextCancelsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fsys := fstest.MapFS{
		"00001_first.sql": {Data: []byte("-- +goose Up\nCREATE TABLE first_table (id bigint);\n")},
		"00002_slow.sql":  {Data: []byte("-- +goose Up\nCREATE TABLE slow_table (id bigint);\nSELECT pg_sleep(5);\n")},
	}
	g, err := gooselock.New(newLessor(t, b.pool, "slow", fencelock.WithoutHeartbeat()), "goose:slow", 2*time.Second)
	require.NoError(t, err)
	p := newGooseProvider(t, b.pool, fsys, g)
	ctx, cancel := g.Context(b.ctx)
	defer cancel()
	start := time.Now()
	_, err = p.Up(ctx)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, fencelock.ErrLeaseLost, "Up reports the loss (from Unlock)")
	require.ErrorIs(t, err, fencelock.ErrNotHeld)
	var partial *goose.PartialError
	require.ErrorAs(t, err, &partial, "the run stopped in a migration")
	require.ErrorIs(t, partial.Err, context.Canceled, "the migration in flight was cancelled")
	require.Less(t, elapsed, 4500*time.Millisecond, "the slow migration (5 s) ran on after the loss")
	require.ErrorIs(t, context.Cause(ctx), fencelock.ErrLeaseLost)
	var slow *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT to_regclass('public.slow_table')::text`).Scan(&slow))
	require.Nil(t, slow, "the cancelled migration committed")
	var version int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(max(version_id), 0) FROM `+gooseVersionTable).Scan(&version))
	require.Less(t, version, int64(2))
}

// Unlock does not cancel a context from Context, which goes on watching the next Lock; Done
// and Err follow the lease of the last Lock.
func TestGooseLockerContextSurvivesUnlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, err := gooselock.New(newLessor(t, b.pool, "calm"), "goose:calm", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := g.Context(b.ctx)
	require.NoError(t, g.Lock(b.ctx, nil))
	done := g.Done()
	require.NoError(t, g.Unlock(b.ctx, nil))
	require.ErrorIs(t, g.Err(), fencelock.ErrReleased)
	select {
	case <-done:
	default:
		t.Fatal("Done still open after Unlock")
	}
	require.NoError(t, g.Lock(b.ctx, nil))
	require.NoError(t, g.Err())
	select {
	case <-g.Done():
		t.Fatal("Done of the new lease closed while held")
	default:
	}
	require.NoError(t, g.Unlock(b.ctx, nil))
	require.NoError(t, ctx.Err(), "a clean Unlock cancelled the context")
	cancel()
	require.ErrorIs(t, context.Cause(ctx), context.Canceled)
}

// Bad input is refused with an *ArgumentError before any SQL, by the rules of Acquire.
func TestGooseLockerBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.pool, "args")
	slow := newLessor(t, b.pool, "slow-heartbeat", fencelock.WithHeartbeatInterval(5*time.Second))
	tests := []struct {
		name   string
		lessor *fencelock.Lessor
		lease  string
		ttl    time.Duration
		arg    string
	}{
		{"NilLessor", nil, "goose", time.Second, "lessor"},
		{"EmptyName", l, "", time.Second, "name"},
		{"NameWithNUL", l, "go\x00ose", time.Second, "name"},
		{"ZeroTTL", l, "goose", 0, "ttl"},
		{"TTLPastMax", l, "goose", fencelock.MaxTTL + time.Second, "ttl"},
		{"TTLNotAboveHeartbeat", slow, "goose", time.Second, "WithHeartbeatInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := gooselock.New(tt.lessor, tt.lease, tt.ttl)
			require.Nil(t, g)
			require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
			var ae *fencelock.ArgumentError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, tt.arg, ae.Arg)
		})
	}
}

// Lock twice without Unlock fails with ErrAlreadyHeld, whether the first holds the lease or
// still waits for it; Unlock without Lock fails with ErrNotHeld; before the first Lock, Done
// is closed and Err wraps ErrNotHeld.
func TestGooseLockerMisuse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, err := gooselock.New(newLessor(t, b.pool, "migrator"), "goose:misuse", 10*time.Second)
	require.NoError(t, err)

	require.ErrorIs(t, g.Unlock(b.ctx, nil), fencelock.ErrNotHeld)
	require.ErrorIs(t, g.Err(), fencelock.ErrNotHeld)
	select {
	case <-g.Done():
	default:
		t.Fatal("Done open before the first Lock")
	}

	require.NoError(t, g.Lock(b.ctx, nil))
	require.ErrorIs(t, g.Lock(b.ctx, nil), fencelock.ErrAlreadyHeld)
	require.NoError(t, g.Err(), "the refused Lock changed the held lease")
	require.NoError(t, g.Unlock(b.ctx, nil))
	require.ErrorIs(t, g.Unlock(b.ctx, nil), fencelock.ErrNotHeld)

	// A Lock that waits for another holder's lease: a second Lock is refused at once.
	other := newLessor(t, b.pool, "other")
	held, err := other.TryAcquire(b.ctx, "goose:misuse", 10*time.Second)
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() { waiting <- g.Lock(b.ctx, nil) }()
	awaitQueue(t, b.ctx, b.pool, "goose:misuse", false, "migrator")
	require.ErrorIs(t, g.Lock(b.ctx, nil), fencelock.ErrAlreadyHeld)
	require.NoError(t, held.Release(b.ctx))
	select {
	case err := <-waiting:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting Lock was not granted within 10 s of the release")
	}
	require.NoError(t, g.Unlock(b.ctx, nil))
}
