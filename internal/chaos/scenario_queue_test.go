package chaos

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// Scenario 11: a waiter killed with kill -9 at the head of a lease's queue (a child process,
// its place live, its lessor listening), a second waiter, listening too, behind it. Each case
// is judged on the database clock, by the rows the library leaves behind: fencelock.leases (a
// grant's token and acquired_at) and fencelock.lease_waiters, whose granted_token only
// fencelock.hand_off writes, when a release hands the lease to the head of the queue (it also
// dates the new grant: acquired_at is the hand-off's clock_timestamp(), the grant's expiry
// that plus the waiter's TTL). The stated bounds are docs/RELIABILITY.md's:
//
//   - ReleasedAfterPlaceExpired: the dead waiter's place expires by its liveness (its row's
//     expires_at is at most the liveness after the kill, dated once the child's sessions have
//     all ended, so after its last refresh), and the release then serves the waiter behind:
//     the token its Acquire returns is the one the release drew into that waiter's row, at a
//     time between the release's start and its return, and the dead place got nothing.
//   - ReleasedWhileDeadWaiterLive: the release hands the lease to the dead waiter (its row
//     records a token drawn during the release), whose grant lapses by its TTL; the waiter
//     behind, now at the head, takes it by its own look as it expires: its grant starts no
//     earlier than that expiry and at most a third of its liveness (its refresh) after it,
//     plus what the machine added meanwhile, measured in the same run (probeMachine: the worst
//     lateness of a control timer, the waiter's timers being as late, and three times the
//     worst grant statement: the look that read the remaining TTL, and the grant).
//
// Tokens rise through it all. Everything else is a hang bound: a waiter never granted, a place
// that never expires, a child whose sessions never end.
func TestScenarioQueueWaiterKilled(t *testing.T) {
	t.Parallel()
	// A bound for hangs: each attempt takes a few seconds, more on a loaded machine.
	e := setup(t, setupOpts{scenario: "11-queue-waiter-killed", timeout: 5 * time.Minute})
	backoff := backoffUpTo(20 * time.Millisecond)
	for _, tc := range []queueKillCase{
		// The release hands the lease to the dead waiter; it lapses after its TTL; the next
		// waiter, woken by its refresh (a third of its liveness) or already at the head, takes
		// it as it expires. Its TTL is the dead waiter's, so it refreshes as the bound says.
		{"ReleasedWhileDeadWaiterLive", true, queueTTL},
		// Released once the dead waiter's place has expired: a hand-off to the next waiter.
		// Its TTL is long, so that the handed grant's trust window does not end before a
		// loaded machine lets it claim the grant (then it would take the lease anew, by its
		// own look), and its place (liveness 5 s) outlives its refreshes' delays.
		{"ReleasedAfterPlaceExpired", false, 30 * time.Second},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// A loaded machine can delay the release past a place's liveness (the dead
			// waiter's, for ReleasedWhileDeadWaiterLive; the next waiter's refresh, for
			// ReleasedAfterPlaceExpired), and then the case did not happen: the database shows
			// it, the attempt says so, and the case runs again.
			for attempt := 1; ; attempt++ {
				missed := runQueueWaiterKilled(t, e, tc, attempt, backoff)
				if missed == "" {
					return
				}
				if attempt == 4 {
					t.Fatalf("in %d of %d attempts the case never happened, last: %s", attempt, attempt, missed)
				}
				t.Logf("chaos: scenario=%s case=%s attempt %d: %s; again", e.report.Scenario, tc.desc, attempt, missed)
			}
		})
	}
}

// Scenario 11's TTL (the dead waiter's) and the dead waiter's liveness in the queue
// (timing.QueueLiveness(queueTTL)).
const (
	queueTTL  = time.Second
	queueLive = time.Second
)

// queueKillCase is a case of scenario 11.
type queueKillCase struct {
	desc          string
	releaseAtOnce bool          // release right after the kill, while the dead waiter's place is live
	nextTTL       time.Duration // the next waiter's TTL
}

// runQueueWaiterKilled runs one attempt of a case of scenario 11. It returns why the case did
// not happen ("" when it did): releaseAtOnce asked for a release while the dead waiter's
// place was live, and the place had expired by the time the release committed; or the next
// waiter's place may have expired by then (its expiry, read before the release, was not after
// the release's return), and the release did not hand it the lease.
func runQueueWaiterKilled(t *testing.T, e *env, tc queueKillCase, attempt int, backoff fencelock.LessorOption) (missed string) {
	ctx, db := e.ctx, e.db
	name := fmt.Sprintf("queue:%s:%d", tc.desc, attempt)
	rec := newRecorder(t, ctx, db.Pool)
	holder, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("holder"), backoff)
	require.NoError(t, err)
	// The holder releases when told; its TTL only has to outlast a heartbeat that a loaded
	// machine delays (a lapse would free the lease without a release).
	lh, err := holder.TryAcquire(ctx, name, 30*time.Second)
	require.NoError(t, err)

	// The child's sessions carry an application_name of their own, so that the test can
	// tell when they have all ended.
	const deadApp = "chaos-scenario11-dead"
	c := startChild(t, childConfig{URL: withAppName(db.URL, deadApp), Worker: "dead", Name: name, TTL: queueTTL}, rec)
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
		lease, err := next.Acquire(ctx, name, tc.nextTTL)
		got <- result{lease, err, time.Now()}
	}()
	// Both listening (their places record their NOTIFY channels): each is woken, or handed
	// the lease, by NOTIFY, and otherwise looks again on the queue's own schedule. The dead
	// waiter first, unless a refresh of its came after its place's liveness (a child starved
	// for a second on a loaded machine): it then joined again, behind next, and the case did
	// not happen.
	var order []string
	testkit.WaitFor(t, ctx, "both waiters in the queue, listening", func() bool {
		q := testkit.ReadQueue(t, ctx, db.Pool, name)
		order = order[:0]
		for _, w := range q {
			if !w.Notify {
				return false
			}
			order = append(order, w.Holder)
		}
		return len(order) == 2
	})
	if !slices.Equal(order, []string{"dead", "next"}) {
		c.kill()
		require.NoError(t, lh.Release(ctx))
		r := testkit.Receive(t, got, time.Minute, "grant of the next waiter")
		require.NoError(t, r.err)
		require.NoError(t, r.lease.Release(ctx))
		return fmt.Sprintf("the queue was %v: the dead waiter's place had expired before the kill (its refresh came late) and it joined again behind next", order)
	}
	var sessions int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, deadApp).Scan(&sessions))
	require.Positive(t, sessions, "the child's sessions do not show its application_name")

	c.kill()
	if !tc.releaseAtOnce {
		// Dated once every session of the child has ended: no statement of the dead waiter
		// (a refresh in flight at the kill) runs after this. Its place must expire by its
		// liveness after that last refresh, so by killedDB + liveness at the latest.
		killedDB, gone := awaitSessionsGone(t, ctx, db.Pool, deadApp)
		awaitHolders(t, ctx, db.Pool, name, "next")
		var expires time.Time
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT expires_at FROM fencelock.lease_waiters WHERE name = $1 AND holder = 'dead'`, name).Scan(&expires))
		t.Logf("chaos: scenario=%s dead waiter's place expires %v after the kill on the database clock (its sessions ended %v after the kill returned; liveness %v)",
			e.report.Scenario, expires.Sub(killedDB).Round(time.Millisecond), gone.Round(time.Millisecond), queueLive)
		require.False(t, expires.After(killedDB.Add(queueLive)), "the dead waiter's place outlived its liveness: expires_at %v, its sessions gone at %v", expires, killedDB)
	}
	// The next waiter's place, as it was before the release (a refresh only extends it).
	var nextLiveUntil time.Time
	if !tc.releaseAtOnce {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT expires_at FROM fencelock.lease_waiters WHERE name = $1 AND holder = 'next'`, name).Scan(&nextLiveUntil))
	}
	var releaseBegan, releasedDB time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&releaseBegan))
	released := time.Now()
	measure := func() (late, grant time.Duration) { return 0, 0 }
	if tc.releaseAtOnce {
		measure = sync.OnceValues(probeMachine(ctx, db.Pool, name+":probe", queueTTL, func() time.Time { return released }))
		defer measure() // the probe stops whatever happens
	}
	require.NoError(t, lh.Release(ctx))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&releasedDB))
	// A bound for hangs (the next waiter is due within the TTL plus a refresh of the release).
	r := testkit.Receive(t, got, time.Minute, "grant of the waiter behind the killed one")
	require.NoError(t, r.err)
	t.Logf("chaos: scenario=%s case=%s next waiter's Acquire returned %v after the release (local clock, not a bound)",
		e.report.Scenario, tc.desc, r.at.Sub(released).Round(time.Millisecond))
	require.Greater(t, r.lease.Token(), lh.Token())

	// What the database recorded: the next waiter's grant, the token the release handed to
	// its place if any, and the dead waiter's place.
	var (
		acquiredAt     time.Time
		nextHanded     int64
		deadToken      int64
		deadGrantEnds  *time.Time
		deadGoneBefore bool
	)
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT l.acquired_at,
		       coalesce((SELECT w.granted_token FROM fencelock.lease_waiters AS w WHERE w.name = $1 AND w.holder = 'next'), 0),
		       coalesce((SELECT w.granted_token FROM fencelock.lease_waiters AS w WHERE w.name = $1 AND w.holder = 'dead'), 0),
		       (SELECT w.granted_expires_at FROM fencelock.lease_waiters AS w WHERE w.name = $1 AND w.holder = 'dead'),
		       coalesce((SELECT w.expires_at <= $3 FROM fencelock.lease_waiters AS w WHERE w.name = $1 AND w.holder = 'dead'), false)
		FROM fencelock.leases AS l WHERE l.name = $1 AND l.holder = 'next' AND l.token = $2`,
		name, int64(r.lease.Token()), releasedDB).Scan(&acquiredAt, &nextHanded, &deadToken, &deadGrantEnds, &deadGoneBefore))
	require.Greater(t, int64(r.lease.Token()), deadToken)
	late, grant := measure()
	require.NoError(t, r.lease.Release(ctx))
	during := func(at time.Time) bool { return !at.Before(releaseBegan) && !at.After(releasedDB) }

	if !tc.releaseAtOnce {
		require.Zero(t, deadToken, "the release handed the lease to the dead waiter, whose place had expired")
		if nextHanded == 0 && !nextLiveUntil.After(releasedDB) {
			return fmt.Sprintf("the next waiter's place (live until %v before the release) may have expired before the release committed (%v)", nextLiveUntil, releasedDB)
		}
		require.Equal(t, int64(r.lease.Token()), nextHanded,
			"the next waiter's grant was not served by the release (its place, live until at least %v, records token %d; the release committed by %v)", nextLiveUntil, nextHanded, releasedDB)
		require.True(t, during(acquiredAt), "the grant handed to the next waiter began at %v, not during the release (%v to %v)", acquiredAt, releaseBegan, releasedDB)
		t.Logf("chaos: scenario=%s case=%s next waiter served by the release: token %d handed at %v (release began %v before, returned %v after)",
			e.report.Scenario, tc.desc, nextHanded, acquiredAt, acquiredAt.Sub(releaseBegan), releasedDB.Sub(acquiredAt))
		return ""
	}

	if deadToken == 0 {
		// No hand-off to the dead waiter: right only if its place had expired by the
		// time the release committed (the database clock read right after it).
		if deadGoneBefore {
			return "the dead waiter's place expired before the release"
		}
		require.Positive(t, deadToken, "the release did not hand the lease to the dead waiter, whose place was live when it committed")
	}
	require.NotNil(t, deadGrantEnds, "the dead waiter's place records token %d but no expiry", deadToken)
	handed := deadGrantEnds.Add(-queueTTL)
	require.True(t, during(handed), "the grant handed to the dead waiter began at %v, not during the release (%v to %v)", handed, releaseBegan, releasedDB)
	require.False(t, acquiredAt.Before(*deadGrantEnds), "the next waiter's grant began at %v, before the dead waiter's grant expired at %v", acquiredAt, *deadGrantEnds)
	bound := queueLive/3 + late + 3*grant
	took := acquiredAt.Sub(*deadGrantEnds)
	t.Logf("chaos: scenario=%s case=%s next waiter granted %v after the dead waiter's grant expired (database clock; bound %v: a third of the liveness + timer lateness %v + 3 x grant statement %v)",
		e.report.Scenario, tc.desc, took.Round(time.Millisecond), bound, late, grant)
	require.Less(t, took, bound, "the next waiter did not take the lease as the dead waiter's grant expired")
	return ""
}

// awaitHolders waits until the live waiters of name are exactly holders, in that order,
// failing the test after 10 s.
func awaitHolders(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string, holders ...string) {
	t.Helper()
	testkit.AwaitQueue(t, ctx, pool, name, false, holders...)
}

// withAppName returns the connection string dsn (a URL or keyword/value pairs) with
// application_name app.
func withAppName(dsn, app string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " application_name=" + app
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "application_name=" + url.QueryEscape(app)
}

// awaitSessionsGone waits until no session of the current database has application_name app
// (a hang bound of 30 s), and returns the database clock then and how long that took. A
// backend ends only after the statement it runs, so no statement of those sessions runs
// after the time returned.
func awaitSessionsGone(t *testing.T, ctx context.Context, pool *pgxpool.Pool, app string) (at time.Time, took time.Duration) {
	t.Helper()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	testkit.WaitFor(t, wctx, fmt.Sprintf("the sessions of %q ended", app), func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, app).Scan(&n))
		return n == 0
	})
	took = time.Since(start)
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at))
	return at, took
}
