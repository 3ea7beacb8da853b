package fencelock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/gooselock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/job"
)

// Every path that ends something (release, unlock, resign, leave a queue, clean up) finishes
// its work when the caller's context has just ended: it detaches from ctx's cancellation, with
// a bound of its own (DESIGN.md). Each test below calls one such path with a context that has
// already ended, then checks the server: the name is free at once (another lessor is granted
// it), an advisory key is free, nothing is left in a queue.

// endedCtx returns a copy of parent that has already ended, as a caller's context has when its
// deadline passed or its request was cancelled just before the release.
var endedCtx = testkit.EndedContext

// requireFree fails the test unless another lessor is granted name at once (TryAcquire), then
// releases that grant.
func requireFree(t *testing.T, b *bundle, name string) {
	t.Helper()
	fencetest.RequireFree(t, b.Ctx, b.Pool, name)
}

// requireNoWaiters fails the test unless the queue of lease name is empty.
func requireNoWaiters(t *testing.T, b *bundle, name string) {
	t.Helper()
	require.Empty(t, readQueue(t, b.Ctx, b.Pool, name), "places left in the queue of %q", name)
}

// Lease.Release with an ended ctx ends the grant on the server: the name is free at once; with
// a waiter queued, the release hands the lease to it.
func TestEndedContextLeaseRelease(t *testing.T) {
	t.Parallel()

	t.Run("Plain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		lease, err := newLessor(t, b.Pool, "holder").TryAcquire(b.Ctx, "ended:plain", 10*time.Second)
		require.NoError(t, err)
		require.NoError(t, lease.Release(endedCtx(b.Ctx)))
		require.ErrorIs(t, lease.Err(), fencelock.ErrReleased)
		requireFree(t, b, "ended:plain")
	})

	t.Run("HandsOffToWaiter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		lease, err := newLessor(t, b.Pool, "holder").TryAcquire(b.Ctx, "ended:handoff", time.Minute)
		require.NoError(t, err)
		waiting := fencetest.AcquireAsync(b.Ctx, newLessor(t, b.Pool, "waiter"), "ended:handoff", time.Minute)
		awaitQueue(t, b.Ctx, b.Pool, "ended:handoff", true, "waiter")
		require.NoError(t, lease.Release(endedCtx(b.Ctx)))
		got := fencetest.Receive(t, waiting, 5*time.Second) // the TTL is a minute: only a hand-off is this fast
		require.NoError(t, got.Err)
		require.Greater(t, got.Lease.Token(), lease.Token())
		require.Equal(t, leaseRow{Holder: "waiter", Token: int64(got.Lease.Token())}, readLease(t, b.Ctx, b.Pool, "ended:handoff"))
		requireNoWaiters(t, b, "ended:handoff")
		require.NoError(t, got.Lease.Release(b.Ctx))
	})
}

// AdvisoryLock.Unlock with an ended ctx unlocks on the session and puts the connection back
// in the pool (it does not close a session that holds nothing): the key is free at once.
func TestEndedContextAdvisoryUnlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	a, err := fencelock.NewAdvisoryLocker(pool)
	require.NoError(t, err)
	lk, err := a.TryLock(b.Ctx, "ended:advisory")
	require.NoError(t, err)
	pid := lk.BackendPID()

	require.NoError(t, lk.Unlock(endedCtx(b.Ctx)))
	require.ErrorIs(t, lk.Err(), fencelock.ErrUnlocked)
	other, err := fencelock.NewAdvisoryLocker(b.Pool)
	require.NoError(t, err)
	lk2, err := other.TryLock(b.Ctx, "ended:advisory")
	require.NoError(t, err, "the key is still held")
	require.NoError(t, lk2.Unlock(b.Ctx))
	conn, err := pool.Acquire(b.Ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.Equal(t, pid, conn.Conn().PgConn().PID(), "the session was closed instead of going back to the pool")
}

// Term.Resign with an ended ctx ends the term and wakes the election's observers: they see
// nobody leading at once, not a TTL (30 s) later.
func TestEndedContextTermResign(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := fencetest.NewElection(t, b.Pool, "leader", "election/ended", 30*time.Second)
	term, err := e.Campaign(b.Ctx, "leader:1")
	require.NoError(t, err)
	octx, stop := context.WithCancel(b.Ctx)
	defer stop()
	seen := e.Observe(octx)
	require.Equal(t, term.Token(), fencetest.Next(t, seen).Token)

	require.NoError(t, term.Resign(endedCtx(b.Ctx)))
	require.ErrorIs(t, term.Err(), fencelock.ErrReleased)
	require.Zero(t, fencetest.Next(t, seen).Token, "nobody leads: the observer is woken by the resign, within 10 s")
	_, err = e.Leader(b.Ctx)
	require.ErrorIs(t, err, fencelock.ErrNoLeader)
	requireFree(t, b, "election/ended")
}

// Election.Run whose ctx ends while it leads resigns the term (detached): the term is free
// when Run returns.
func TestEndedContextElectionRunExit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := fencetest.NewElection(t, b.Pool, "leader", "election/run", 30*time.Second)
	ctx, cancel := context.WithCancel(b.Ctx)
	var stopped error
	err := e.Run(ctx, "leader:1", fencelock.ElectionCallbacks{
		OnStartedLeading: func(context.Context, *fencelock.Term) { cancel() },
		OnStoppedLeading: func(_ *fencelock.Term, err error) { stopped = err },
	})
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, stopped, fencelock.ErrReleased)
	requireFree(t, b, "election/run")
}

// A Campaign whose ctx ends while it waits leaves nothing in the queue.
func TestEndedContextCampaignExit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := fencetest.NewElection(t, b.Pool, "leader", "election/wait", 30*time.Second)
	term, err := e.Campaign(b.Ctx, "leader")
	require.NoError(t, err)
	ec := fencetest.NewElection(t, b.Pool, "candidate", "election/wait", 30*time.Second)
	ctx, cancel := context.WithCancel(b.Ctx)
	campaigned := make(chan error, 1)
	go func() {
		_, err := ec.Campaign(ctx, "candidate")
		campaigned <- err
	}()
	awaitQueue(t, b.Ctx, b.Pool, "election/wait", false, "candidate")
	cancel()
	require.ErrorIs(t, <-campaigned, context.Canceled)
	requireNoWaiters(t, b, "election/wait")
	require.NoError(t, term.Resign(b.Ctx))
	requireFree(t, b, "election/wait")
}

// LeaseSet.Release with an ended ctx releases every member.
func TestEndedContextLeaseSetRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	names := []string{"set:a", "set:b", "set:c"}
	set, err := newLessor(t, b.Pool, "holder").TryAcquireAll(b.Ctx, names, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, set.Release(endedCtx(b.Ctx)))
	require.ErrorIs(t, set.Err(), fencelock.ErrReleased)
	other, err := newLessor(t, b.Pool, "other").TryAcquireAll(b.Ctx, names, 10*time.Second)
	require.NoError(t, err, "members are still held")
	require.NoError(t, other.Release(b.Ctx))
}

// A semaphore permit's Release with an ended ctx ends the permit: another lessor gets it at
// once; with a waiter queued, the waiter gets it and the queue is empty.
func TestEndedContextPermitRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, err := fencelock.NewSemaphore(newLessor(t, b.Pool, "holder"), "sem:ended", 1)
	require.NoError(t, err)
	permit, err := s.TryAcquire(b.Ctx, time.Minute)
	require.NoError(t, err)
	require.NoError(t, permit.Release(endedCtx(b.Ctx)))
	require.ErrorIs(t, permit.Err(), fencelock.ErrReleased)

	s2, err := fencelock.NewSemaphore(newLessor(t, b.Pool, "other"), "sem:ended", 1)
	require.NoError(t, err)
	permit2, err := s2.TryAcquire(b.Ctx, time.Minute)
	require.NoError(t, err, "the permit is still held")

	// A waiter: the release with an ended ctx lets it in, well before the permit's TTL.
	s3, err := fencelock.NewSemaphore(newLessor(t, b.Pool, "waiter"), "sem:ended", 1)
	require.NoError(t, err)
	waiting := fencetest.PermitAsync(b.Ctx, s3, time.Minute)
	waitFor(t, b, "the waiter queues", func() bool {
		st, err := s.State(b.Ctx)
		require.NoError(t, err)
		return st.Waiting == 1
	})
	require.NoError(t, permit2.Release(endedCtx(b.Ctx)))
	got := fencetest.Receive(t, waiting, 10*time.Second)
	require.NoError(t, got.Err)
	st, err := s.State(b.Ctx)
	require.NoError(t, err)
	require.Equal(t, fencelock.SemaphoreState{Limit: 1, Held: 1, Waiting: 0}, st)
	require.NoError(t, got.Lease.Release(b.Ctx))
}

// gooselock.Locker.Unlock with an ended ctx (goose's locktesting does this: it unlocks with the
// Lock context, past its deadline) releases the lease.
func TestEndedContextGooseUnlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, err := gooselock.New(newLessor(t, b.Pool, "migrator"), "goose:ended", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithDeadline(b.Ctx, time.Now().Add(time.Minute))
	require.NoError(t, g.Lock(ctx, nil))
	cancel()
	require.NoError(t, g.Unlock(ctx, nil))
	require.ErrorIs(t, g.Err(), fencelock.ErrReleased)
	requireFree(t, b, "goose:ended")
}

// An Acquire whose ctx ends while it waits leaves the queue before it returns.
func TestEndedContextLeaveQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := newLessor(t, b.Pool, "holder").TryAcquire(b.Ctx, "ended:queue", time.Minute)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.Ctx)
	waiting := fencetest.AcquireAsync(ctx, newLessor(t, b.Pool, "waiter"), "ended:queue", time.Minute)
	awaitQueue(t, b.Ctx, b.Pool, "ended:queue", false, "waiter")
	cancel()
	require.ErrorIs(t, fencetest.Receive(t, waiting, 10*time.Second).Err, context.Canceled)
	requireNoWaiters(t, b, "ended:queue")
	require.NoError(t, holder.Release(b.Ctx))
}

// RunLeased whose ctx ends during fn releases the lease before it returns.
func TestEndedContextRunLeased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.Ctx)
	err := newLessor(t, b.Pool, "runner").RunLeased(ctx, "ended:run", 10*time.Second, func(ctx context.Context, _ *fencelock.Lease) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	requireFree(t, b, "ended:run")
}

// RunLocked whose ctx ends during fn rolls its transaction back (fn's write is not committed,
// even when fn returns nil) and leaves the row free and the queue empty when it returns: the
// rollback does not depend on the ended ctx, and the session is not closed to end it.
func TestEndedContextRunLocked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fnErr bool // fn returns ctx's error (else nil)
	}{
		{"FnReturnsNil", false},
		{"FnReturnsCtxErr", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			createWrites(t, b)
			const name = "ended:locked"
			// A TTL holder first, so that RunLocked waits in the queue before it gets the row.
			holder, err := newLessor(t, b.Pool, "holder").TryAcquire(b.Ctx, name, time.Minute)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(b.Ctx)
			defer cancel()
			var pid uint32
			ran := make(chan error, 1)
			runner := newLessor(t, b.Pool, "runner")
			go func() {
				ran <- runner.RunLocked(ctx, name, func(ctx context.Context, tx pgx.Tx, token fencelock.Token) error {
					pid = tx.Conn().PgConn().PID()
					if _, err := tx.Exec(ctx, `INSERT INTO writes (resource, token) VALUES ($1, $2)`, name, int64(token)); err != nil {
						return err
					}
					cancel()
					if tt.fnErr {
						return ctx.Err()
					}
					return nil
				})
			}()
			awaitQueue(t, b.Ctx, b.Pool, name, false, "runner")
			require.NoError(t, holder.Release(b.Ctx))
			select {
			case err = <-ran:
			case <-time.After(10 * time.Second):
				t.Fatal("RunLocked did not return within 10 s of the release")
			}
			require.ErrorIs(t, err, context.Canceled)
			require.Empty(t, writtenTokens(t, b, name), "fn's write committed after ctx ended")
			requireNoWaiters(t, b, name)
			requireFree(t, b, name)
			var alive bool
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, int32(pid)).Scan(&alive))
			require.True(t, alive, "the session was closed to end the transaction")
		})
	}
}

// A Job's run whose ctx ends during fn releases the job's lease before RunSlot returns.
func TestEndedContextJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, err := job.New(newLessor(t, b.Pool, "replica"), "job:ended", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.Ctx)
	err = j.RunSlot(ctx, time.Now(), func(ctx context.Context, _ *job.Run) error {
		cancel()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	requireFree(t, b, "job:ended")
}

// Migrate whose ctx ends mid-run ends its lock before it returns: the advisory key is free.
func TestEndedContextMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := gooseProvider(t, b.Pool).DownTo(b.Ctx, 4)
	require.NoError(t, err)
	// Migration 00005 waits for this transaction's lock on fencelock.leases.
	hold, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer hold.Rollback(context.Background())
	_, err = hold.Exec(b.Ctx, `LOCK TABLE fencelock.leases IN ACCESS SHARE MODE`)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.Ctx)
	migrated := make(chan error, 1)
	go func() { migrated <- fencelock.Migrate(ctx, b.Pool) }()
	waitFor(t, b, "Migrate reaches migration 00005", func() bool {
		var waiting bool
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND relation = 'fencelock.leases'::regclass
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting))
		return waiting
	})
	cancel()
	require.ErrorIs(t, <-migrated, context.Canceled)
	var took bool
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT pg_try_advisory_xact_lock($1)`, migrateLockKey).Scan(&took))
	require.True(t, took, "Migrate's lock is still held after it returned")
	require.NoError(t, hold.Rollback(b.Ctx))
	require.NoError(t, fencelock.Migrate(b.Ctx, b.Pool), "a later Migrate finishes the run")
}
