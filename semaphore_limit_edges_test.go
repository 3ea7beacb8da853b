package fencelock_test

// Adversarial review of the semaphore hand-off (migration 00012). Each TestReview* test fails
// while the defect it names is there.

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/migrations"
)

// Migration 00012 down and up again with a semaphore in use (permits held above a lowered
// limit, a waiter queued): both directions apply, and the semaphore works on each side.
func TestSemaphoreMigrationDownUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	ps := rvFill(t, ctx, b.Pool, "rm", 3)
	rvExec(t, ctx, b.Pool, `SELECT fencelock.semaphore_set_limit('rm', 2)`)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rm", "w", 100, time.Minute, true, "").outcome)

	db := stdlib.OpenDBFromPool(b.Pool)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(fencelock.VersionTable), goose.WithDisableGlobalRegistry(true), goose.WithLogger(goose.NopLogger()))
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 11)
	require.NoError(t, err)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rm", "x", 200, time.Minute, false, "").outcome, "3 held, limit 2")
	require.EqualValues(t, 1, rvInt(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rm', $1, 'h2', $2)`, ps[2].name, ps[2].token), "released (00008)")
	_, err = b.Pool.Exec(ctx, `SELECT fencelock.semaphore_leave('rm', 200)`)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 12)
	require.NoError(t, err)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rm", "x", 201, time.Minute, false, "").outcome, "2 held, limit 2")
	r := rvInt(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rm', $1, 'h0', $2)`, ps[0].name, ps[0].token)
	w := rvAcquire(t, ctx, b.Pool, "rm", "w", 100, time.Minute, true, "")
	t.Logf("after down and up: release %d, the waiter's attempt %d %q", r, w.outcome, w.name)
	require.Contains(t, []int32{1, 3}, w.outcome, "the waiter at the head, one permit free, limit 2: granted")
	require.EqualValues(t, 2, rvInt(t, ctx, b.Pool, `SELECT held FROM fencelock.semaphore_state WHERE name = 'rm'`))
}

// A6. After a lowered limit (counting grants), a grant that leaves room for more wakes nobody
// (semaphore_acquire dispatches only when not counting; 00008 woke the next waiter when
// permits were left): three permits released at once wake the head only, which takes one;
// the waiter behind it waits for its next refresh with two permits free.
func TestSemaphoreCountingGrantLeavesRoomUntold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	ps := rvFill(t, ctx, b.Pool, "rv6", 5)
	rvExec(t, ctx, b.Pool, `SELECT fencelock.semaphore_set_limit('rv6', 4)`) // rv6#4 held above it: counting
	slow := fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second))
	w1 := newSemaphore(t, b, "rv6-w1", "rv6", 5, slow)
	w2 := newSemaphore(t, b, "rv6-w2", "rv6", 5, slow)
	g1 := fencetest.PermitAsync(ctx, w1, 10*time.Second)
	waitQueued(t, b, w1, 1)
	g2 := fencetest.PermitAsync(ctx, w2, 10*time.Second)
	waitQueued(t, b, w1, 2)
	time.Sleep(100 * time.Millisecond) // past the join rechecks
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for i := range 3 { // three holders finish at once
		rvExec(t, ctx, tx, `SELECT fencelock.semaphore_release('rv6', $1, $2, $3)`, ps[i].name, fmt.Sprint("h", i), ps[i].token)
	}
	require.NoError(t, tx.Commit(ctx))
	released := time.Now()
	r1 := fencetest.Receive(t, g1, 5*time.Second)
	require.NoError(t, r1.Err)
	r2 := fencetest.Receive(t, g2, 5*time.Second)
	require.NoError(t, r2.Err)
	t.Logf("W1 granted %v, W2 %v after the releases (2 of 4 held before them)", r1.At.Sub(released).Round(time.Millisecond), r2.At.Sub(released).Round(time.Millisecond))
	require.Less(t, r2.At.Sub(released), 1200*time.Millisecond, "W2 was not told of the room W1's grant left (the refresh is 1.67 s)")
}

// A7. semaphore_acquire reads t once, at its start, and later treats a free permit whose row
// expired after t as "held after all": it deletes it from the free set. A grant that waited
// (here: its reclaim's insert into the free set waits for another grant's commit, as a grant
// commits synchronously for its token) meanwhile sees a release free a permit after t, pops
// it, and throws it away: the try is refused with a permit free and nobody waiting, and so is
// every attempt until next_reclaim (up to a second later).
func TestSemaphoreStaleClockDropsFreePermit(t *testing.T) {
	b, ctx := rvSemaphore(t, "rv7", 3)
	pa := rvAcquire(t, ctx, b.Pool, "rv7", "a", 1, time.Minute, false, "")
	pb := rvAcquire(t, ctx, b.Pool, "rv7", "b", 2, time.Minute, false, "")
	require.Equal(t, "rv7#0", pa.name)
	require.Equal(t, "rv7#1", pb.name)

	x, err := b.Pool.Begin(ctx) // a grant whose commit is slow
	require.NoError(t, err)
	defer func() { _ = x.Rollback(ctx) }()
	require.Equal(t, "rv7#2", rvAcquire(t, ctx, x, "rv7", "x", 3, time.Minute, false, "").name)

	done := make(chan rvAttempt, 1)
	go func() {
		a, err := rvAcquireErr(ctx, b.Pool, "rv7", "g", 4, time.Minute, false, "")
		if err != nil {
			t.Error(err)
		}
		done <- a
	}()
	rvWaitLockedOrDone(t, b, "semaphore_acquire", 5*time.Second, func() bool { return len(done) > 0 })
	// A releases rv7#0 while G waits: nobody waits, so it goes to the free set.
	require.EqualValues(t, 1, rvInt(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rv7', $1, 'a', $2)`, pa.name, pa.token))
	require.NoError(t, x.Commit(ctx))
	g := <-done
	h := rvAcquire(t, ctx, b.Pool, "rv7", "h", 5, time.Minute, false, "")
	free := rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv7' AND slot = 0`)
	t.Logf("G: outcome %d %q; a try right after: outcome %d %q; rv7#0 in the free set: %d", g.outcome, g.name, h.outcome, h.name, free)
	require.True(t, g.outcome == 1 || h.outcome == 1, "two tries refused with rv7#0 free (2 of 3 permits held, nobody waiting)")
}

// A8. A waiter's refresh waits for another waiter's grant statement: the head's grant gives
// the permits left free to the waiters behind it (semaphore_dispatch, in the head's
// transaction), locking and deleting their queue rows; a waiter refreshing its place at that
// moment (INSERT ... ON CONFLICT on its row) waits until the head's transaction ends, its
// synchronous commit and the NOTIFY queue's lock included. (TestSemaphoreNoWaiterWaitsForAnother
// sees it under load: up to 141 samples, 2 ms apart, of one SemaphoreAcquire waiting on
// another's transaction.)
func TestSemaphoreRefreshWaitsForHeadsGrant(t *testing.T) {
	b, ctx := rvSemaphore(t, "rv8", 2)
	pa := rvAcquire(t, ctx, b.Pool, "rv8", "a", 1, time.Minute, false, "")
	pb := rvAcquire(t, ctx, b.Pool, "rv8", "b", 2, time.Minute, false, "")
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rv8", "w1", 101, time.Minute, true, "").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rv8", "w2", 102, time.Minute, true, "").outcome)
	// Free permits while both wait: two releases that met both queue rows locked (both
	// waiters refreshing: the lock of their INSERT ... ON CONFLICT DO UPDATE).
	locks, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locks.Rollback(ctx) }()
	rvExec(t, ctx, locks, `SELECT 1 FROM fencelock.semaphore_waiters WHERE semaphore = 'rv8' FOR UPDATE`)
	rvExec(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rv8', $1, 'a', $2)`, pa.name, pa.token)
	rvExec(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rv8', $1, 'b', $2)`, pb.name, pb.token)
	require.NoError(t, locks.Commit(ctx))
	require.EqualValues(t, 2, rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv8'`))

	head, err := b.Pool.Begin(ctx) // W1's attempt: granted, and it gives W2 a permit
	require.NoError(t, err)
	defer func() { _ = head.Rollback(ctx) }()
	require.EqualValues(t, 1, rvAcquire(t, ctx, head, "rv8", "w1", 101, time.Minute, true, "").outcome)
	start := time.Now()
	done := make(chan rvAttempt, 1)
	go func() {
		a, err := rvAcquireErr(ctx, b.Pool, "rv8", "w2", 102, time.Minute, true, "")
		if err != nil {
			t.Error(err)
		}
		done <- a
	}()
	select {
	case a := <-done:
		t.Logf("W2's refresh returned %d in %v without waiting", a.outcome, time.Since(start))
	case <-time.After(500 * time.Millisecond):
		_ = head.Commit(ctx)
		a := <-done
		t.Fatalf("W2's refresh waited for W1's grant statement's transaction (then returned %d, %q)", a.outcome, a.name)
	}
}

// Cost after a lowered limit: while one permit above the new limit is held (renewed), every
// grant reads all permits under the semaphore's row FOR NO KEY UPDATE (one at a time). Logs a
// grant + release at a limit of 10,000 with all but one held, before and after lowering the
// limit by one while the top permit stays held.
func TestSemaphoreCostAfterLowerLimit(t *testing.T) {
	const n = 10_000
	// n-2 permits held for an hour (as TryAcquires would leave them), slots 0 and 1 free.
	b, s := filledSemaphore(t, "rvc", n, 2, false)
	grantRelease := func() {
		p, err := s.TryAcquire(b.Ctx, time.Minute)
		require.NoError(t, err)
		require.NoError(t, p.Release(b.Ctx))
	}
	before := timePerCall(50, grantRelease)
	_, err := s.SetLimit(b.Ctx, n-1) // rvc#9999 stays held: counting until it ends
	require.NoError(t, err)
	after := timePerCall(50, grantRelease)
	t.Logf("grant + release at limit %d: %v; after lowering the limit by one: %v (x%.1f)", n, before, after, float64(after)/float64(before))
}

// Cost while an expired permit's row is locked (its old holder's guarded transaction still
// open): semaphore_reclaim returns t ("reclaim again soon"), so every attempt that finds no
// free permit reads all permits again: O(limit) per refused try, not once a second.
func TestSemaphoreCostReclaimWhileGuarded(t *testing.T) {
	const n = 10_000
	// All n permits held for an hour but rvg#0, expired; none free.
	b, s := filledSemaphore(t, "rvg", n, 0, true)
	ctx := b.Ctx
	refused := func() {
		_, err := s.TryAcquire(ctx, time.Minute)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	}
	// rvg#0 expired, its row locked FOR KEY SHARE (as GuardTx holds it).
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rvExec(t, ctx, tx, `SELECT 1 FROM fencelock.leases WHERE name = 'rvg#0' FOR KEY SHARE`)
	guarded := timePerCall(40, refused)
	// The invariant behind the cost, whatever the machine's speed: reclaims (each one reads
	// every permit row, and moves next_reclaim) are at least 100 ms apart while an expired
	// permit stays guarded, however many tries are refused in between. Counted from the values
	// next_reclaim takes, against the time the tries took on the database clock.
	const tries = 12
	seen := map[time.Time]bool{}
	var first, last time.Time
	for i := range tries {
		_, err := s.TryAcquire(ctx, time.Minute)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		var nr, now time.Time
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT next_reclaim, clock_timestamp() FROM fencelock.semaphores WHERE name = 'rvg'`).Scan(&nr, &now))
		seen[nr] = true
		if i == 0 {
			first = now
		}
		last = now
	}
	allowed := int(last.Sub(first)/(100*time.Millisecond)) + 2
	require.LessOrEqual(t, len(seen), allowed, "%d reclaims in %v of %d refused tries: every refused try reads every permit while an expired one is guarded", len(seen), last.Sub(first), tries)
	require.NoError(t, tx.Rollback(ctx))
	// The same with the expired permit reclaimed and granted (all held): reclaims a second apart.
	// Tries until the permit is granted (the next reclaim, at most 100 ms after the last): 30 s
	// is a bound for a permit never freed, not for the speed of a try, which reads 10,000
	// permits and takes seconds on a loaded machine.
	var p *fencelock.Lease
	freeBy := time.Now().Add(30 * time.Second)
	for {
		p, err = s.TryAcquire(ctx, time.Hour)
		if err == nil {
			break
		}
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.True(t, time.Now().Before(freeBy), "the expired permit is not reclaimed in 30 s once its guard ends")
		time.Sleep(10 * time.Millisecond)
	}
	defer func() { _ = p.Release(ctx) }()
	full := timePerCall(40, refused)
	t.Logf("refused try at limit %d, all held: %v; with one expired permit guarded: %v (x%.1f)", n, full, guarded, float64(guarded)/float64(full))
}

// filledSemaphore runs t in parallel on a database of its own, where it sets semaphore name's
// limit to n and fills permits lo..n-1 with rows held by "filler" for an hour (permit lo
// already expired when loExpired), none of them on the free list, then analyzes the leases
// table. It returns the database and a Semaphore of name for a lessor of its own.
func filledSemaphore(t *testing.T, name string, n, lo int, loExpired bool) (*bundle, *fencelock.Semaphore) {
	t.Helper()
	t.Parallel()
	b := setup(t)
	rvExec(t, b.Ctx, b.Pool, `SELECT fencelock.semaphore_set_limit($1, $2)`, name, n)
	rvExec(t, b.Ctx, b.Pool, `INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
		SELECT $1 || '#' || i, 'filler', fencelock.next_token(false), clock_timestamp(),
		       clock_timestamp() + CASE WHEN i = $3 AND $4 THEN interval '0' ELSE interval '1 hour' END
		FROM generate_series($3::int, $2 - 1) AS i`, name, n, lo, loExpired)
	rvExec(t, b.Ctx, b.Pool, `DELETE FROM fencelock.semaphore_free WHERE semaphore = $1 AND slot >= $2`, name, lo)
	rvExec(t, b.Ctx, b.Pool, `VACUUM ANALYZE fencelock.leases`)
	s, err := fencelock.NewSemaphore(newLessor(t, b.Pool, name+"-l"), name, n)
	require.NoError(t, err)
	return b, s
}

// timePerCall returns the mean wall time of k calls of call, one after another, measured after
// k calls that warm caches and plans up.
func timePerCall(k int, call func()) time.Duration {
	for range k {
		call()
	}
	start := time.Now()
	for range k {
		call()
	}
	return time.Since(start) / time.Duration(k)
}
