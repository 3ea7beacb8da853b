package fencelock_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// bigPool opens a pool of 40 connections on the test's database: every session lock holds a
// connection, and the default pool (4 connections on 2 cores) is soon exhausted.
func bigPool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	return testkit.NewPool(t, b.Ctx, b.DB.URL, testkit.MaxConns(40))
}

// newLocker returns an advisory locker on pool with opts, failing the test on error;
// advisoryHolders lists the backend pids holding (granted) or waiting for a key; keyOf returns
// the int64 advisory lock key that a locker derives for a name.
var (
	newLocker       = fencetest.NewLocker
	advisoryHolders = testkit.AdvisoryHolders
	keyOf           = fencetest.KeyOf
)

func TestAdvisorySessionLocks(t *testing.T) {
	t.Parallel()

	t.Run("ExclusiveOneWinner", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, c := newLocker(t, b.Pool), newLocker(t, b.Pool)
		la, err := a.TryLock(b.Ctx, "report")
		require.NoError(t, err)
		_, err = c.TryLock(b.Ctx, "report")
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.Equal(t, []uint32{la.BackendPID()}, advisoryHolders(t, b.Ctx, b.Pool, keyOf(t, a, "report"), true))
		// (The session's label, set by the watchdog's first probe: TestAdvisoryLabelLazy.)

		require.NoError(t, la.Unlock(b.Ctx))
		require.ErrorIs(t, la.Err(), fencelock.ErrUnlocked)
		require.Empty(t, advisoryHolders(t, b.Ctx, b.Pool, keyOf(t, a, "report"), true))
		lc, err := c.TryLock(b.Ctx, "report")
		require.NoError(t, err)
		require.NoError(t, lc.Unlock(b.Ctx))
		require.ErrorIs(t, lc.Unlock(b.Ctx), fencelock.ErrNotHeld)
	})

	t.Run("SharedCoexistExclusiveWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, c, d := newLocker(t, b.Pool), newLocker(t, b.Pool), newLocker(t, b.Pool)
		s1, err := a.TryLock(b.Ctx, "cfg", fencelock.Shared)
		require.NoError(t, err)
		s2, err := c.TryLock(b.Ctx, "cfg", fencelock.Shared)
		require.NoError(t, err)
		_, err = d.TryLock(b.Ctx, "cfg")
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, s1.Unlock(b.Ctx))
		require.NoError(t, s2.Unlock(b.Ctx))
		x, err := d.TryLock(b.Ctx, "cfg")
		require.NoError(t, err)
		_, err = a.TryLock(b.Ctx, "cfg", fencelock.Shared)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, x.Unlock(b.Ctx))
	})

	t.Run("KeyForms", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, c := newLocker(t, b.Pool), newLocker(t, b.Pool)
		// (0, 5) and 5 are different locks in Postgres.
		l1, err := a.TryLock(b.Ctx, "", fencelock.AtKey(fencelock.Int64Key(5)))
		require.NoError(t, err)
		l2, err := c.TryLock(b.Ctx, "", fencelock.AtKey(fencelock.Int32PairKey(0, 5)))
		require.NoError(t, err)
		_, err = c.TryLock(b.Ctx, "", fencelock.AtKey(fencelock.Int64Key(5)))
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		// Interoperates with plain SQL on the same key.
		var got bool
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT pg_try_advisory_lock(0, 5)`).Scan(&got))
		require.False(t, got)
		require.NoError(t, l1.Unlock(b.Ctx))
		require.NoError(t, l2.Unlock(b.Ctx))
	})

	t.Run("ReentrancyCollisionAndCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := newLocker(t, b.Pool, fencelock.WithMaxSessionLocks(2))
		l1, err := a.TryLock(b.Ctx, "one")
		require.NoError(t, err)
		_, err = a.TryLock(b.Ctx, "one")
		require.ErrorIs(t, err, fencelock.ErrAlreadyHeld)
		l2, err := a.TryLock(b.Ctx, "two")
		require.NoError(t, err)
		_, err = a.TryLock(b.Ctx, "three")
		require.ErrorIs(t, err, fencelock.ErrTooManyLocks)
		require.NoError(t, l1.Unlock(b.Ctx))
		require.NoError(t, l2.Unlock(b.Ctx))

		// A weak hash forces a collision: within one locker it is named; across lockers it
		// shows as contention (never as two holders).
		weak := fencelock.WithKeyHash(func(ns, name string) int64 { return 42 })
		w1, w2 := newLocker(t, b.Pool, weak), newLocker(t, b.Pool, weak)
		la, err := w1.TryLock(b.Ctx, "alpha")
		require.NoError(t, err)
		_, err = w1.TryLock(b.Ctx, "beta")
		var collision *fencelock.KeyCollisionError
		require.ErrorAs(t, err, &collision)
		require.Equal(t, fencelock.KeyCollisionError{Key: fencelock.Int64Key(42), Name: "beta", Held: "alpha"}, *collision)
		_, err = w2.TryLock(b.Ctx, "beta")
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, la.Unlock(b.Ctx))
	})

	t.Run("FencingTokens", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		createWrites(t, b)
		a := newLocker(t, b.Pool, fencelock.WithFencingTokens())
		lessor := newLessor(t, b.Pool, "l")
		lease, err := lessor.TryAcquire(b.Ctx, "lease", time.Minute)
		require.NoError(t, err)
		l1, err := a.TryLock(b.Ctx, "job")
		require.NoError(t, err)
		require.Greater(t, l1.Token(), lease.Token())
		require.NoError(t, l1.Unlock(b.Ctx))
		l2, err := a.Lock(b.Ctx, "job")
		require.NoError(t, err)
		require.Greater(t, l2.Token(), l1.Token())
		require.NoError(t, fencedWrite(b.Ctx, b.Pool, "job", l2.Token()))
		err = fencedWrite(b.Ctx, b.Pool, "job", l1.Token())
		require.ErrorIs(t, err, fencelock.ErrStaleToken)
		require.NoError(t, l2.Unlock(b.Ctx))
		require.NoError(t, lease.Release(b.Ctx))

		plain := newLocker(t, b.Pool)
		l3, err := plain.TryLock(b.Ctx, "job")
		require.NoError(t, err)
		require.Zero(t, l3.Token())
		require.NoError(t, l3.Unlock(b.Ctx))
	})
}

// Queued waiters are granted in the order they queued, each when the one before unlocks.
func TestAdvisoryLockFIFO(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Pool = bigPool(t, b)
	holder := newLocker(t, b.Pool)
	h, err := holder.TryLock(b.Ctx, "q")
	require.NoError(t, err)
	key := keyOf(t, holder, "q")

	const waiters = 4
	order := make(chan int, waiters)
	locks := make(chan *fencelock.AdvisoryLock, waiters)
	errs := make(chan error, waiters)
	for i := range waiters {
		w := newLocker(t, b.Pool)
		go func() {
			lk, err := w.Lock(b.Ctx, "q")
			if err != nil {
				errs <- err
				return
			}
			order <- i
			locks <- lk
		}()
		// Wait until this waiter is queued on the server before starting the next.
		require.Eventually(t, func() bool { return len(advisoryHolders(t, b.Ctx, b.Pool, key, false)) == i+1 },
			10*time.Second, 2*time.Millisecond)
	}
	require.NoError(t, h.Unlock(b.Ctx))
	for want := range waiters {
		select {
		case got := <-order:
			require.Equal(t, want, got)
			require.NoError(t, (<-locks).Unlock(b.Ctx))
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not granted", want)
		}
	}
}

func TestAdvisoryTxLocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createWrites(t, b)
	a := newLocker(t, b.Pool, fencelock.WithFencingTokens())
	tx1, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(b.Ctx) }()
	tok1, err := a.TryLockTx(b.Ctx, tx1, "batch")
	require.NoError(t, err)
	require.Greater(t, tok1, fencelock.Token(0))

	// Excludes other transactions and session locks until tx1 ends.
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		_, err := a.TryLockTx(b.Ctx, tx, "batch")
		return err
	})
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	_, err = newLocker(t, b.Pool).TryLock(b.Ctx, "batch")
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.NoError(t, fencelock.FenceTx(b.Ctx, tx1, "batch", tok1))
	require.NoError(t, tx1.Commit(b.Ctx))

	var tok2 fencelock.Token
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		var err error
		tok2, err = a.LockTx(b.Ctx, tx, "batch")
		return err
	}))
	require.Greater(t, tok2, tok1)

	// Shared transaction locks coexist.
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		if _, err := a.TryLockTx(b.Ctx, tx, "batch", fencelock.Shared); err != nil {
			return err
		}
		return pgx.BeginFunc(b.Ctx, b.Pool, func(tx2 pgx.Tx) error {
			_, err := a.LockTx(b.Ctx, tx2, "batch", fencelock.Shared)
			return err
		})
	}))
}
