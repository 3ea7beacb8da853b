package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// Scenario 11: a waiter killed with kill -9 at the head of a lease's queue (a child process,
// its place live, its lessor listening). The waiter behind it is granted within the stated
// bound (docs/RELIABILITY.md): the dead waiter's place expires by its liveness (for TTL 1 s,
// 1 s after its last refresh, which is at most a third of that before the kill); a release in
// between hands the lease to the dead waiter, whose grant then lapses by its TTL, and the
// waiter behind, now at the head, takes it as it expires. Tokens rise through it all.
func TestScenarioQueueWaiterKilled(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "11-queue-waiter-killed"})
	const ttl = time.Second
	const live = time.Second             // queueLiveness(ttl)
	const slack = 500 * time.Millisecond // scheduling under -race on 2 cores
	backoff := backoffUpTo(20 * time.Millisecond)
	for _, tc := range []queueKillCase{
		// The release hands the lease to the dead waiter; it lapses after its TTL; the next
		// waiter, woken by its refresh (a third of its liveness) or already at the head, takes
		// it as it expires.
		{"ReleasedWhileDeadWaiterLive", true, ttl + live/3 + slack},
		// Released once the dead waiter's place has expired: a hand-off to the next waiter.
		{"ReleasedAfterPlaceExpired", false, slack},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// A loaded machine can delay the release past the dead waiter's liveness, and then
			// the case did not happen: the attempt says so, and the case runs again.
			for attempt := 1; ; attempt++ {
				if runQueueWaiterKilled(t, e, tc, attempt, ttl, live, slack, backoff) {
					return
				}
				if attempt == 4 {
					t.Fatalf("the release came after the dead waiter's place expired in %d of %d attempts: the case never happened", attempt, attempt)
				}
				t.Logf("chaos: scenario=%s case=%s attempt %d: the dead waiter's place expired before the release; again", e.report.Scenario, tc.desc, attempt)
			}
		})
	}
}

// queueKillCase is a case of scenario 11.
type queueKillCase struct {
	desc          string
	releaseAtOnce bool // release right after the kill, while the dead waiter's place is live
	bound         time.Duration
}

// runQueueWaiterKilled runs one attempt of a case of scenario 11. It reports false when the
// case did not happen: releaseAtOnce asked for a release while the dead waiter's place was
// live, and the place had expired by the time the release committed.
func runQueueWaiterKilled(t *testing.T, e *env, tc queueKillCase, attempt int, ttl, live, slack time.Duration, backoff fencelock.LessorOption) bool {
	ctx, db := e.ctx, e.db
	name := fmt.Sprintf("queue:%s:%d", tc.desc, attempt)
	rec := newRecorder(t, ctx, db.Pool)
	holder, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("holder"), backoff)
	require.NoError(t, err)
	lh, err := holder.TryAcquire(ctx, name, ttl)
	require.NoError(t, err)

	c := startChild(t, childConfig{URL: db.URL, Worker: "dead", Name: name, TTL: ttl}, rec)
	awaitHolders(t, ctx, db.Pool, name, "dead")
	next, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("next"), backoff)
	require.NoError(t, err)
	type result struct {
		lease *fencelock.Lease
		err   error
		at    time.Time
	}
	got := make(chan result, 1)
	go func() {
		lease, err := next.Acquire(ctx, name, ttl)
		got <- result{lease, err, time.Now()}
	}()
	awaitHolders(t, ctx, db.Pool, name, "dead", "next")

	killed := time.Now()
	c.kill()
	if !tc.releaseAtOnce {
		awaitHolders(t, ctx, db.Pool, name, "next")
		left := time.Since(killed)
		require.Less(t, left, live+slack, "the dead waiter's place outlived its liveness")
		t.Logf("chaos: scenario=%s dead waiter's place expired %v after the kill (liveness %v)", e.report.Scenario, left.Round(time.Millisecond), live)
	}
	released := time.Now()
	require.NoError(t, lh.Release(ctx))
	var releasedDB time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&releasedDB))
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter behind the killed one was never granted")
	}
	require.NoError(t, r.err)
	took := r.at.Sub(released)
	t.Logf("chaos: scenario=%s case=%s next waiter granted %v after the release (bound %v)", e.report.Scenario, tc.desc, took.Round(time.Millisecond), tc.bound)
	require.Less(t, took, tc.bound)
	require.Greater(t, r.lease.Token(), lh.Token())
	var deadToken int64
	var expiredBeforeRelease bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(max(granted_token), 0), coalesce(bool_or(expires_at <= $2), false) FROM fencelock.lease_waiters WHERE name = $1 AND holder = 'dead'`, name, releasedDB).Scan(&deadToken, &expiredBeforeRelease))
	require.Greater(t, int64(r.lease.Token()), deadToken)
	require.NoError(t, r.lease.Release(ctx))
	if tc.releaseAtOnce && deadToken == 0 {
		// No hand-off to the dead waiter: right only if its place had expired by the
		// time the release committed (the database clock read right after it).
		if expiredBeforeRelease {
			return false
		}
		require.Positive(t, deadToken, "the release did not hand the lease to the dead waiter, whose place was live when it committed")
	}
	return true
}

// awaitHolders waits until the live waiters of name are exactly holders, in that order,
// failing the test after 10 s.
func awaitHolders(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string, holders ...string) {
	t.Helper()
	testkit.AwaitQueue(t, ctx, pool, name, false, holders...)
}
