package gooselock_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/gooselock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// gooseMigrations are the application's migrations of the goose tests, kept in the version
// table gooseVersionTable; newGooseProvider returns a goose provider of a migration set on a
// pool, locked by a locker.
var (
	gooseMigrations  = fencetest.GooseMigrations
	newGooseProvider = fencetest.NewGooseProvider
)

const gooseVersionTable = fencetest.GooseVersionTable

// providerLocking runs goose's own contract test, locktesting.TestProviderLocking, on
// gooselock.Lockers, each migrator with its own pool on url (fencetest.GooseProviderLocking).
func providerLocking(t *testing.T, b *bundle, url string) {
	fencetest.GooseProviderLocking(t, b.Ctx, b.Pool, func(t *testing.T) *pgxpool.Pool { return newPool(t, b.Ctx, url) }, gooselock.New)
}

// goose's contract test for lockers, on direct connections: one migrator applies everything.
func TestGooseLockerProviderLocking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	providerLocking(t, b, b.DB.URL)
}

// concurrentLocking runs goose's other contract test, locktesting.TestConcurrentLocking, on
// gooselock.Lockers on pool (fencetest.GooseConcurrentLocking).
func concurrentLocking(t *testing.T, b *bundle, pool *pgxpool.Pool) {
	fencetest.GooseConcurrentLocking(t, b.Ctx, b.Pool, pool, gooselock.New)
}

// goose's contract test for concurrent lockers, on direct connections.
func TestGooseLockerConcurrentLocking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	concurrentLocking(t, b, b.Pool)
}

// A lease lost while locked (no heartbeat, TTL 1 s): Done closes at the end of the trust
// window, Err and the cause of a context from Context match ErrLeaseLost, and Unlock reports
// the loss (ErrNotHeld and ErrLeaseLost) while releasing what is left; the locker can lock again.
func TestGooseLockerLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, err := gooselock.New(newLessor(t, b.Pool, "lost", fencelock.WithoutHeartbeat()), "goose:lost", time.Second)
	require.NoError(t, err)
	ctx, cancel := g.Context(b.Ctx)
	defer cancel()
	require.NoError(t, g.Lock(b.Ctx, nil))
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

	err = g.Unlock(b.Ctx, nil)
	require.ErrorIs(t, err, fencelock.ErrNotHeld)
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	require.ErrorIs(t, g.Err(), fencelock.ErrLeaseLost, "Err keeps the loss after Unlock")

	require.NoError(t, g.Lock(b.Ctx, nil))
	require.NoError(t, g.Unlock(b.Ctx, nil))
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
	g, err := gooselock.New(newLessor(t, b.Pool, "slow", fencelock.WithoutHeartbeat()), "goose:slow", 2*time.Second)
	require.NoError(t, err)
	p := newGooseProvider(t, b.Pool, fsys, g)
	ctx, cancel := g.Context(b.Ctx)
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
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT to_regclass('public.slow_table')::text`).Scan(&slow))
	require.Nil(t, slow, "the cancelled migration committed")
	var version int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT coalesce(max(version_id), 0) FROM `+gooseVersionTable).Scan(&version))
	require.Less(t, version, int64(2))
}

// Unlock does not cancel a context from Context, which goes on watching the next Lock; Done
// and Err follow the lease of the last Lock.
func TestGooseLockerContextSurvivesUnlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, err := gooselock.New(newLessor(t, b.Pool, "calm"), "goose:calm", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := g.Context(b.Ctx)
	require.NoError(t, g.Lock(b.Ctx, nil))
	done := g.Done()
	require.NoError(t, g.Unlock(b.Ctx, nil))
	require.ErrorIs(t, g.Err(), fencelock.ErrReleased)
	select {
	case <-done:
	default:
		t.Fatal("Done still open after Unlock")
	}
	require.NoError(t, g.Lock(b.Ctx, nil))
	require.NoError(t, g.Err())
	select {
	case <-g.Done():
		t.Fatal("Done of the new lease closed while held")
	default:
	}
	require.NoError(t, g.Unlock(b.Ctx, nil))
	require.NoError(t, ctx.Err(), "a clean Unlock cancelled the context")
	cancel()
	require.ErrorIs(t, context.Cause(ctx), context.Canceled)
}

// Bad input is refused with an *ArgumentError before any SQL, by the rules of Acquire.
func TestGooseLockerBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "args")
	slow := newLessor(t, b.Pool, "slow-heartbeat", fencelock.WithHeartbeatInterval(5*time.Second))
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
			fencetest.RequireArgError(t, err, tt.arg)
		})
	}
}

// Lock twice without Unlock fails with ErrAlreadyHeld, whether the first holds the lease or
// still waits for it; Unlock without Lock fails with ErrNotHeld; before the first Lock, Done
// is closed and Err wraps ErrNotHeld.
func TestGooseLockerMisuse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, err := gooselock.New(newLessor(t, b.Pool, "migrator"), "goose:misuse", 10*time.Second)
	require.NoError(t, err)

	require.ErrorIs(t, g.Unlock(b.Ctx, nil), fencelock.ErrNotHeld)
	require.ErrorIs(t, g.Err(), fencelock.ErrNotHeld)
	select {
	case <-g.Done():
	default:
		t.Fatal("Done open before the first Lock")
	}

	require.NoError(t, g.Lock(b.Ctx, nil))
	require.ErrorIs(t, g.Lock(b.Ctx, nil), fencelock.ErrAlreadyHeld)
	require.NoError(t, g.Err(), "the refused Lock changed the held lease")
	require.NoError(t, g.Unlock(b.Ctx, nil))
	require.ErrorIs(t, g.Unlock(b.Ctx, nil), fencelock.ErrNotHeld)

	// A Lock that waits for another holder's lease: a second Lock is refused at once.
	other := newLessor(t, b.Pool, "other")
	held, err := other.TryAcquire(b.Ctx, "goose:misuse", 10*time.Second)
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() { waiting <- g.Lock(b.Ctx, nil) }()
	awaitQueue(t, b.Ctx, b.Pool, "goose:misuse", false, "migrator")
	require.ErrorIs(t, g.Lock(b.Ctx, nil), fencelock.ErrAlreadyHeld)
	require.NoError(t, held.Release(b.Ctx))
	select {
	case err := <-waiting:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting Lock was not granted within 10 s of the release")
	}
	require.NoError(t, g.Unlock(b.Ctx, nil))
}
