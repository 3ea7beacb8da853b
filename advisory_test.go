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
	return testkit.NewPool(t, b.ctx, b.db.URL, testkit.MaxConns(40))
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
		a, c := newLocker(t, b.pool), newLocker(t, b.pool)
		la, err := a.TryLock(b.ctx, "report")
		require.NoError(t, err)
		_, err = c.TryLock(b.ctx, "report")
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.Equal(t, []uint32{la.BackendPID()}, advisoryHolders(t, b.ctx, b.pool, keyOf(t, a, "report"), true))
		var app string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = $1`, la.BackendPID()).Scan(&app))
		require.Equal(t, "fencelock report", app)

		require.NoError(t, la.Unlock(b.ctx))
		require.ErrorIs(t, la.Err(), fencelock.ErrUnlocked)
		require.Empty(t, advisoryHolders(t, b.ctx, b.pool, keyOf(t, a, "report"), true))
		lc, err := c.TryLock(b.ctx, "report")
		require.NoError(t, err)
		require.NoError(t, lc.Unlock(b.ctx))
		require.ErrorIs(t, lc.Unlock(b.ctx), fencelock.ErrNotHeld)
	})

	t.Run("SharedCoexistExclusiveWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, c, d := newLocker(t, b.pool), newLocker(t, b.pool), newLocker(t, b.pool)
		s1, err := a.TryLock(b.ctx, "cfg", fencelock.Shared)
		require.NoError(t, err)
		s2, err := c.TryLock(b.ctx, "cfg", fencelock.Shared)
		require.NoError(t, err)
		_, err = d.TryLock(b.ctx, "cfg")
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, s1.Unlock(b.ctx))
		require.NoError(t, s2.Unlock(b.ctx))
		x, err := d.TryLock(b.ctx, "cfg")
		require.NoError(t, err)
		_, err = a.TryLock(b.ctx, "cfg", fencelock.Shared)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, x.Unlock(b.ctx))
	})

	t.Run("KeyForms", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, c := newLocker(t, b.pool), newLocker(t, b.pool)
		// (0, 5) and 5 are different locks in Postgres.
		l1, err := a.TryLock(b.ctx, "", fencelock.AtKey(fencelock.Int64Key(5)))
		require.NoError(t, err)
		l2, err := c.TryLock(b.ctx, "", fencelock.AtKey(fencelock.Int32PairKey(0, 5)))
		require.NoError(t, err)
		_, err = c.TryLock(b.ctx, "", fencelock.AtKey(fencelock.Int64Key(5)))
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		// Interoperates with plain SQL on the same key.
		var got bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pg_try_advisory_lock(0, 5)`).Scan(&got))
		require.False(t, got)
		require.NoError(t, l1.Unlock(b.ctx))
		require.NoError(t, l2.Unlock(b.ctx))
	})

	t.Run("ReentrancyCollisionAndCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := newLocker(t, b.pool, fencelock.WithMaxSessionLocks(2))
		l1, err := a.TryLock(b.ctx, "one")
		require.NoError(t, err)
		_, err = a.TryLock(b.ctx, "one")
		require.ErrorIs(t, err, fencelock.ErrAlreadyHeld)
		l2, err := a.TryLock(b.ctx, "two")
		require.NoError(t, err)
		_, err = a.TryLock(b.ctx, "three")
		require.ErrorIs(t, err, fencelock.ErrTooManyLocks)
		require.NoError(t, l1.Unlock(b.ctx))
		require.NoError(t, l2.Unlock(b.ctx))

		// A weak hash forces a collision: within one locker it is named; across lockers it
		// shows as contention (never as two holders).
		weak := fencelock.WithKeyHash(func(ns, name string) int64 { return 42 })
		w1, w2 := newLocker(t, b.pool, weak), newLocker(t, b.pool, weak)
		la, err := w1.TryLock(b.ctx, "alpha")
		require.NoError(t, err)
		_, err = w1.TryLock(b.ctx, "beta")
		var collision *fencelock.KeyCollisionError
		require.ErrorAs(t, err, &collision)
		require.Equal(t, fencelock.KeyCollisionError{Key: fencelock.Int64Key(42), Name: "beta", Held: "alpha"}, *collision)
		_, err = w2.TryLock(b.ctx, "beta")
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, la.Unlock(b.ctx))
	})

	t.Run("FencingTokens", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		createWrites(t, b)
		a := newLocker(t, b.pool, fencelock.WithFencingTokens())
		lessor := newLessor(t, b.pool, "l")
		lease, err := lessor.TryAcquire(b.ctx, "lease", time.Minute)
		require.NoError(t, err)
		l1, err := a.TryLock(b.ctx, "job")
		require.NoError(t, err)
		require.Greater(t, l1.Token(), lease.Token())
		require.NoError(t, l1.Unlock(b.ctx))
		l2, err := a.Lock(b.ctx, "job")
		require.NoError(t, err)
		require.Greater(t, l2.Token(), l1.Token())
		require.NoError(t, fencedWrite(b.ctx, b.pool, "job", l2.Token()))
		err = fencedWrite(b.ctx, b.pool, "job", l1.Token())
		require.ErrorIs(t, err, fencelock.ErrStaleToken)
		require.NoError(t, l2.Unlock(b.ctx))
		require.NoError(t, lease.Release(b.ctx))

		plain := newLocker(t, b.pool)
		l3, err := plain.TryLock(b.ctx, "job")
		require.NoError(t, err)
		require.Zero(t, l3.Token())
		require.NoError(t, l3.Unlock(b.ctx))
	})
}

// Queued waiters are granted in the order they queued, each when the one before unlocks.
func TestAdvisoryLockFIFO(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.pool = bigPool(t, b)
	holder := newLocker(t, b.pool)
	h, err := holder.TryLock(b.ctx, "q")
	require.NoError(t, err)
	key := keyOf(t, holder, "q")

	const waiters = 4
	order := make(chan int, waiters)
	locks := make(chan *fencelock.AdvisoryLock, waiters)
	errs := make(chan error, waiters)
	for i := range waiters {
		w := newLocker(t, b.pool)
		go func() {
			lk, err := w.Lock(b.ctx, "q")
			if err != nil {
				errs <- err
				return
			}
			order <- i
			locks <- lk
		}()
		// Wait until this waiter is queued on the server before starting the next.
		require.Eventually(t, func() bool { return len(advisoryHolders(t, b.ctx, b.pool, key, false)) == i+1 },
			10*time.Second, 2*time.Millisecond)
	}
	require.NoError(t, h.Unlock(b.ctx))
	for want := range waiters {
		select {
		case got := <-order:
			require.Equal(t, want, got)
			require.NoError(t, (<-locks).Unlock(b.ctx))
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
	a := newLocker(t, b.pool, fencelock.WithFencingTokens())
	tx1, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(b.ctx) }()
	tok1, err := a.TryLockTx(b.ctx, tx1, "batch")
	require.NoError(t, err)
	require.Greater(t, tok1, fencelock.Token(0))

	// Excludes other transactions and session locks until tx1 ends.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := a.TryLockTx(b.ctx, tx, "batch")
		return err
	})
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	_, err = newLocker(t, b.pool).TryLock(b.ctx, "batch")
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.NoError(t, fencelock.FenceTx(b.ctx, tx1, "batch", tok1))
	require.NoError(t, tx1.Commit(b.ctx))

	var tok2 fencelock.Token
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		tok2, err = a.LockTx(b.ctx, tx, "batch")
		return err
	}))
	require.Greater(t, tok2, tok1)

	// Shared transaction locks coexist.
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := a.TryLockTx(b.ctx, tx, "batch", fencelock.Shared); err != nil {
			return err
		}
		return pgx.BeginFunc(b.ctx, b.pool, func(tx2 pgx.Tx) error {
			_, err := a.LockTx(b.ctx, tx2, "batch", fencelock.Shared)
			return err
		})
	}))
}

// A session lock names its session "fencelock <name>" (or "fencelock key <key>") while held,
// and Unlock puts back the application_name the session had, also one set after it connected
// (read from the server's reports, for a lock on an int64 key), for each statement form: an
// int64 key exclusive and shared, and a pair key.
func TestAdvisoryApplicationNameRestored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc, name, before, held string
		opts                     []fencelock.LockOption
	}{
		{"Int64Key", "job", "worker-7", "fencelock job", nil},
		{"Shared", "job", "set later", "fencelock job", []fencelock.LockOption{fencelock.Shared}},
		{"PairKey", "", "worker 8", "fencelock key (1,2)", []fencelock.LockOption{fencelock.AtKey(fencelock.Int32PairKey(1, 2))}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg, err := pgxpool.ParseConfig(b.db.URL)
			require.NoError(t, err)
			cfg.MaxConns = 1 // one session: the one the lock takes
			cfg.ConnConfig.RuntimeParams["application_name"] = "at-connect"
			pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			_, err = pool.Exec(b.ctx, `SELECT set_config('application_name', $1, false)`, tc.before)
			require.NoError(t, err)
			appOf := func(pid uint32) string {
				var app string
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&app))
				return app
			}

			lk, err := newLocker(t, pool).TryLock(b.ctx, tc.name, tc.opts...)
			require.NoError(t, err)
			require.Equal(t, tc.held, appOf(lk.BackendPID()))
			require.NoError(t, lk.Unlock(b.ctx))
			require.Equal(t, tc.before, appOf(lk.BackendPID()), "the session's own name, put back")
		})
	}
}
