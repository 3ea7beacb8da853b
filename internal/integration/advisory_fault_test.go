package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

const testWatchdog = 100 * time.Millisecond

// The watchdog bound: Done closes at most two intervals after the session is lost. Waits get
// a generous margin above it for a loaded 2-core machine.
const watchdogBound = 2*testWatchdog + 2*time.Second

// pg_terminate_backend on the holder: the lock is free for others at once, and the holder's
// Done closes within the watchdog bound.
func TestAdvisoryBackendTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := newLocker(t, b.Pool, fencelock.WithWatchdogInterval(testWatchdog))
	c := newLocker(t, b.Pool)
	lk, err := a.TryLock(b.Ctx, "job")
	require.NoError(t, err)
	require.NoError(t, b.DB.Server.TerminateBackend(b.Ctx, lk.BackendPID()))
	lc, err := c.TryLock(b.Ctx, "job")
	require.NoError(t, err, "the lock must be free as soon as its session is gone")
	start := time.Now()
	select {
	case <-lk.Done():
		t.Logf("Done closed %v after the lock was taken over", time.Since(start))
	case <-time.After(watchdogBound):
		t.Fatalf("Done not closed within %v", watchdogBound)
	}
	require.ErrorIs(t, lk.Err(), fencelock.ErrLockLost)
	require.ErrorIs(t, lk.Unlock(b.Ctx), fencelock.ErrNotHeld)
	require.NoError(t, lc.Unlock(b.Ctx))
	// The locker can take the name again.
	again, err := a.TryLock(b.Ctx, "job")
	require.NoError(t, err)
	require.NoError(t, again.Unlock(b.Ctx))
}

// Server crash and restart: Done closes within the watchdog bound; after the restart the lock
// can be taken again.
func TestAdvisoryServerCrash(t *testing.T) {
	t.Parallel()
	srv, db, ctx := crashableDB(t, time.Minute)
	a := newLocker(t, db.Pool, fencelock.WithWatchdogInterval(testWatchdog))
	lk, err := a.TryLock(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, srv.Crash(ctx))
	waitLockDone(t, lk, watchdogBound)
	require.ErrorIs(t, lk.Err(), fencelock.ErrLockLost)
	require.NoError(t, srv.Restart(ctx))
	db.Pool.Reset()
	again, err := a.TryLock(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, again.Unlock(ctx))
}

func waitLockDone(t *testing.T, lk *fencelock.AdvisoryLock, limit time.Duration) {
	t.Helper()
	select {
	case <-lk.Done():
	case <-time.After(limit):
		t.Fatalf("Done not closed within %v", limit)
	}
}

// ctx cancelled or timed out during a blocking Lock, 1,000 times (or for 60 s) with jitter, while the holder
// keeps releasing and retaking the lock so that grants race cancellations: afterwards pg_locks
// holds no stray lock, every connection a lock took is back in the pool or closed, no session
// of the test is left on the server once the pool is closed, and no goroutine is left.
//
// Two things end late, by a bound, and the checks wait for them (cancelledCloseBound), while a
// connection never closed or a goroutine that never ends still fails the test:
//   - a Lock whose ctx ends mid-statement returns at once, and pgx closes its connection
//     asynchronously (pgconn's asyncClose: a cancel request, Terminate, a drain until the server
//     hangs up, all within 15 s); its goroutines run until then;
//   - an idle connection of the pool may keep a pgx background reader parked in a read: pgx
//     starts one when a write (a statement, or the startup message of a new connection) takes
//     over 15 ms, and it ends only when its read returns, at the connection's next reply or
//     close. On a loaded machine that happens; it is the pool's, not a lock's, and closing the
//     pool ends it (seen: one such reader alive 30 s after the rounds, with no asyncClose left).
//
// Not parallel: goleak must not see other tests' goroutines.
func TestAdvisoryLockCancelledLeavesNothing(t *testing.T) {
	b := setup(t)
	b.Pool = bigPool(t, b)
	ignore := goleak.IgnoreCurrent()
	holder := newLocker(t, b.Pool)
	key := keyOf(t, holder, "contended")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the holder: take, hold briefly, release, repeat
		for {
			select {
			case <-stop:
				return
			default:
			}
			lk, err := holder.Lock(b.Ctx, "contended")
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
			if err := lk.Unlock(b.Ctx); err != nil {
				t.Error(err)
				return
			}
		}
	})

	// The rounds end at 1,000 or after roundsFor, whichever comes first: beside a second
	// suite, 1,000 rounds took over two minutes and ran out the bundle's context. What the
	// test judges is what is left afterwards, not how many rounds a machine manages.
	const rounds, parallel, roundsFor = 1000, 4, 60 * time.Second
	roundsEnd := time.Now().Add(roundsFor)
	var waiters sync.WaitGroup
	var mu sync.Mutex
	var nGranted, nCancelled int
	next := make(chan int, rounds)
	for i := range rounds {
		next <- i
	}
	close(next)
	for range parallel {
		w := newLocker(t, b.Pool)
		waiters.Go(func() {
			for i := range next {
				if time.Now().After(roundsEnd) {
					return
				}
				var ctx context.Context
				var cancel context.CancelFunc
				if i%2 == 0 {
					ctx, cancel = context.WithTimeout(b.Ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
				} else {
					ctx, cancel = context.WithCancel(b.Ctx)
					time.AfterFunc(time.Duration(rand.IntN(3000))*time.Microsecond, cancel)
				}
				lk, err := w.Lock(ctx, "contended")
				cancel()
				mu.Lock()
				if err == nil {
					nGranted++
				} else {
					nCancelled++
				}
				mu.Unlock()
				if err == nil {
					if err := lk.Unlock(b.Ctx); err != nil {
						t.Error(err)
					}
				} else if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("round %d: %v", i, err)
				}
			}
		})
	}
	waiters.Wait()
	close(stop)
	wg.Wait()
	t.Logf("%d rounds of %d (within %v): %d granted, %d cancelled", nGranted+nCancelled, rounds, roundsFor, nGranted, nCancelled)
	require.Positive(t, nCancelled)

	// The checks have a context of their own, with room for every bound below, so that a
	// slow round phase cannot end them early and read as a stray lock.
	checkCtx, cancelCheck := context.WithTimeout(context.Background(), 4*cancelledCloseBound+30*time.Second)
	defer cancelCheck()

	// Sessions closed after a cancel end on the server shortly after (pgx closes them
	// asynchronously, by its bound); then nothing is held.
	require.Eventually(t, func() bool {
		return len(advisoryHolders(t, checkCtx, b.Pool, key, true))+len(advisoryHolders(t, checkCtx, b.Pool, key, false)) == 0
	}, cancelledCloseBound, 10*time.Millisecond, "stray advisory locks left in pg_locks")

	// Every connection a lock took went back to the pool or was closed (a Lock abandoned in
	// the pool's acquire lets the pool finish its ping in the background first).
	require.Eventually(t, func() bool { return b.Pool.Stat().AcquiredConns() == 0 },
		cancelledCloseBound, 10*time.Millisecond, "connections taken from the pool and never given back")
	closed := make(chan struct{})
	go func() { b.Pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(cancelledCloseBound):
		t.Fatalf("the pool did not close within %v", cancelledCloseBound)
	}
	// No session of the test is left on the server: each closed connection's backend exits.
	checker, err := pgx.Connect(checkCtx, b.DB.URL)
	require.NoError(t, err)
	var left []string
	deadline := time.Now().Add(cancelledCloseBound)
	for {
		rows, err := checker.Query(checkCtx, `
			SELECT format('pid %s application_name %L state %s query %L', pid, application_name, state, left(query, 80))
			FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`)
		require.NoError(t, err)
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, checker.Close(checkCtx))
	require.Empty(t, left, "sessions left on the server %v after the pool closed: connections never closed", cancelledCloseBound)
	verifyNoLeakWithin(t, cancelledCloseBound, ignore)
}

// cancelledCloseBound is how long TestAdvisoryLockCancelledLeavesNothing waits for what ends
// late (see there): pgx's 15 s bound on an asynchronous close, and a margin.
const cancelledCloseBound = 20 * time.Second

// A real PgBouncer in transaction mode: session locks are refused with the typed error;
// transaction locks and leases work.
func TestAdvisoryBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer := pgtest.NewPgBouncer(t, b.DB.Server, "transaction")
	pool := goosePool(t, b.Ctx, bouncer.URL(b.DB.Name), true) // PgBouncer < 1.21: no named prepared statements

	a := newLocker(t, pool, fencelock.WithFencingTokens())
	_, err := a.TryLock(b.Ctx, "job")
	var pe *fencelock.PoolerError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, fencelock.ErrConnectionPooler)
	require.Empty(t, advisoryHolders(t, b.Ctx, b.Pool, keyOf(t, a, "job"), true), "TryLock refused, yet holds")
	_, err = a.Lock(b.Ctx, "job")
	require.ErrorIs(t, err, fencelock.ErrConnectionPooler)
	// Nothing is left held on the server by the refused grants.
	require.Empty(t, advisoryHolders(t, b.Ctx, b.Pool, keyOf(t, a, "job"), true), "Lock refused, yet holds")

	var tok fencelock.Token
	require.NoError(t, pgx.BeginFunc(b.Ctx, pool, func(tx pgx.Tx) error {
		var err error
		if tok, err = a.TryLockTx(b.Ctx, tx, "job"); err != nil {
			return err
		}
		return fencelock.FenceTx(b.Ctx, tx, "job", tok)
	}))
	require.Positive(t, tok)

	l := newLessor(t, pool, "through-bouncer")
	lease, err := l.TryAcquire(b.Ctx, "lease", time.Second)
	require.NoError(t, err)
	require.NoError(t, lease.Renew(b.Ctx))
	require.NoError(t, pgx.BeginFunc(b.Ctx, pool, func(tx pgx.Tx) error { return lease.GuardTx(b.Ctx, tx) }))
	require.NoError(t, lease.Release(b.Ctx))
	require.NoError(t, l.RunLocked(b.Ctx, "lease", func(ctx context.Context, tx pgx.Tx, token fencelock.Token) error {
		return fencelock.FenceTx(ctx, tx, "lease", token)
	}))
}

// A real hot standby (pg_basebackup -R): every lock is refused with the typed error.
func TestRefusedOnHotStandby(t *testing.T) {
	t.Parallel()
	ctx, _, pool := hotStandbyDB(t)

	a := newLocker(t, pool)
	_, err := a.TryLock(ctx, "job")
	require.ErrorIs(t, err, fencelock.ErrReadOnly)
	_, err = a.Lock(ctx, "job")
	require.ErrorIs(t, err, fencelock.ErrReadOnly)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := a.TryLockTx(ctx, tx, "job")
		return err
	})
	require.ErrorIs(t, err, fencelock.ErrReadOnly)
	var held int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&held))
	require.Zero(t, held, "a refused grant leaves nothing held on the standby")

	l := newLessor(t, pool, "on-standby")
	_, err = l.TryAcquire(ctx, "lease", time.Second)
	require.ErrorIs(t, err, fencelock.ErrReadOnly)
	err = l.TryRunLocked(ctx, "lease", func(context.Context, pgx.Tx, fencelock.Token) error { return nil })
	require.ErrorIs(t, err, fencelock.ErrReadOnly)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, "r", 1) })
	require.ErrorIs(t, err, fencelock.ErrReadOnly)
}
