package fencelock_test

// Adversarial review of the semaphore hand-off (migration 00012). Each TestReview* test fails
// while the defect it names is there.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// rvQuerier is what runs a statement: a pool, a pooled connection or a transaction.
type rvQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// rvAttempt is one row of fencelock.semaphore_acquire.
type rvAttempt struct {
	outcome   int32
	name      string
	token     int64
	ahead     int64
	remaining int64
}

// rvAcquire calls fencelock.semaphore_acquire directly, as Semaphore.attempt does.
func rvAcquire(t *testing.T, ctx context.Context, q rvQuerier, sem, who string, wait int64, ttl time.Duration, queue bool, channel string) rvAttempt {
	t.Helper()
	a, err := rvAcquireErr(ctx, q, sem, who, wait, ttl, queue, channel)
	require.NoError(t, err)
	return a
}

// rvWait is a waiter of rvFull: its holder id, wait id and NOTIFY channel ("" for none).
type rvWait struct {
	holder  string
	wait    int64
	channel string
}

// rvSemaphore runs t in parallel on a database of its own, where it sets semaphore sem's limit,
// and returns the database and its context.
func rvSemaphore(t *testing.T, sem string, limit int) (*bundle, context.Context) {
	t.Helper()
	t.Parallel()
	b := setup(t)
	rvExec(t, b.Ctx, b.Pool, `SELECT fencelock.semaphore_set_limit($1, $2)`, sem, limit)
	return b, b.Ctx
}

// rvFull is rvSemaphore with a limit of 1, whose permit it grants to "a" (wait id 1); then it
// queues each of waits in order, all with ttl, failing the test unless each outcome is a grant,
// then a queued wait.
func rvFull(t *testing.T, sem string, ttl time.Duration, waits ...rvWait) (*bundle, context.Context) {
	t.Helper()
	b, ctx := rvSemaphore(t, sem, 1)
	require.EqualValues(t, 1, rvAcquire(t, ctx, b.Pool, sem, "a", 1, ttl, false, "").outcome)
	for _, w := range waits {
		require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, sem, w.holder, w.wait, ttl, true, w.channel).outcome)
	}
	return b, ctx
}

func rvAcquireErr(ctx context.Context, q rvQuerier, sem, who string, wait int64, ttl time.Duration, queue bool, channel string) (rvAttempt, error) {
	var a rvAttempt
	err := q.QueryRow(ctx, `SELECT outcome, coalesce(name, ''), token, ahead, remaining_us
		FROM fencelock.semaphore_acquire($1, $2, $3, $4, 1, $5, $6, $7)`,
		sem, who, wait, ttl.Microseconds(), queue, channel, (5*time.Second).Microseconds()).
		Scan(&a.outcome, &a.name, &a.token, &a.ahead, &a.remaining)
	return a, err
}

// rvFill sets sem's limit to n and takes its n permits, holders h0 to h<n-1> with wait ids 1
// to n, each for a minute.
func rvFill(t *testing.T, ctx context.Context, q rvQuerier, sem string, n int) []rvAttempt {
	t.Helper()
	rvExec(t, ctx, q, `SELECT fencelock.semaphore_set_limit($1, $2)`, sem, n)
	ps := make([]rvAttempt, n)
	for i := range ps {
		ps[i] = rvAcquire(t, ctx, q, sem, fmt.Sprint("h", i), int64(i+1), time.Minute, false, "")
		require.EqualValues(t, 1, ps[i].outcome)
	}
	return ps
}

func rvExec(t *testing.T, ctx context.Context, q rvQuerier, sql string, args ...any) {
	t.Helper()
	_, err := q.Exec(ctx, sql, args...)
	require.NoError(t, err)
}

func rvInt(t *testing.T, ctx context.Context, q rvQuerier, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, q.QueryRow(ctx, sql, args...).Scan(&n))
	return n
}

// rvWaitLocked waits until some backend of b's database waits for a lock while running a
// statement that contains what.
func rvWaitLocked(t *testing.T, b *bundle, what string, limit time.Duration) {
	t.Helper()
	require.Eventually(t, rvLockedOrDone(b, what, func() bool { return false }), limit, 2*time.Millisecond,
		"no statement with %q waits for a lock", what)
}

// rvWaitLockedOrDone waits until some backend of b's database waits for a lock while running a
// statement with what, or done reports that the statement under test has returned (the
// redesign's attempts return at once where 00012's first version waited).
func rvWaitLockedOrDone(t *testing.T, b *bundle, what string, limit time.Duration, done func() bool) {
	t.Helper()
	require.Eventually(t, rvLockedOrDone(b, what, done), limit, 2*time.Millisecond,
		"no statement with %q waits for a lock, nor did it return", what)
}

// rvLockedOrDone is the condition of rvWaitLocked and rvWaitLockedOrDone.
func rvLockedOrDone(b *bundle, what string, done func() bool) func() bool {
	return func() bool {
		if done() {
			return true
		}
		var n int
		err := b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'
			  AND pid <> pg_backend_pid()`, what).Scan(&n)
		return err == nil && n > 0
	}
}

// rvRanSince reports whether a backend of b's database other than the caller's last ran a
// statement with what that started after since and has finished.
func rvRanSince(b *bundle, what string, since time.Time) func() bool {
	return func() bool {
		var n int
		err := b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle' AND query LIKE '%' || $1 || '%'
			  AND query_start > $2 AND pid <> pg_backend_pid()`, what, since).Scan(&n)
		return err == nil && n > 0
	}
}

// rvListen returns a connection of b's pool that LISTENs on channels, and a func that collects
// the notifications it gets within d.
func rvListen(t *testing.T, b *bundle, channels ...string) func(d time.Duration) []*pgconn.Notification {
	t.Helper()
	c, err := b.Pool.Acquire(b.Ctx)
	require.NoError(t, err)
	conn := c.Hijack()
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, ch := range channels {
		_, err := conn.Exec(b.Ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		require.NoError(t, err)
	}
	return func(d time.Duration) []*pgconn.Notification {
		var got []*pgconn.Notification
		deadline := time.Now().Add(d)
		for {
			ctx, cancel := context.WithDeadline(b.Ctx, deadline)
			n, err := conn.WaitForNotification(ctx)
			cancel()
			if err != nil {
				return got
			}
			got = append(got, n)
		}
	}
}

func rvOn(ns []*pgconn.Notification, channel string) []string {
	var p []string
	for _, n := range ns {
		if n.Channel == channel {
			p = append(p, n.Payload)
		}
	}
	return p
}

// A1. A waiter's own grant attempt and a hand-off to the same wait both succeed: the wait
// ends up with two permits, one of which nobody will ever claim (the Acquire returns the
// other; the NOTIFY finds the wait gone and is dropped). Here: W waits at the head; SetLimit
// raises the limit and, in its transaction, hands a new permit to W (dispatch); W's next
// attempt, started meanwhile, blocks on the semaphore's row, then pops a second free permit.
func TestSemaphoreGrantedAndHandedSameWaitSQL(t *testing.T) {
	b, ctx := rvFull(t, "rv1", 10*time.Second, rvWait{"w", 100, ""})

	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rvExec(t, ctx, tx, `SELECT fencelock.semaphore_set_limit('rv1', 3)`)
	require.EqualValues(t, 1, rvInt(t, ctx, tx, `SELECT count(*) FROM fencelock.leases WHERE permit_wait = 100`), "SetLimit handed W a permit")

	done := make(chan rvAttempt, 1)
	go func() {
		a, err := rvAcquireErr(ctx, b.Pool, "rv1", "w", 100, 10*time.Second, true, "")
		if err != nil {
			t.Error(err)
		}
		done <- a
	}()
	rvWaitLockedOrDone(t, b, "semaphore_acquire", 5*time.Second, func() bool { return len(done) > 0 })
	require.NoError(t, tx.Commit(ctx))
	a := <-done
	held := rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.leases WHERE holder = 'w' AND expires_at > clock_timestamp()`)
	t.Logf("W's attempt: outcome %d, permit %q; permits the server has for W: %d", a.outcome, a.name, held)
	if a.outcome == 1 || a.outcome == 3 {
		require.EqualValues(t, 1, held, "the attempt returned one permit, the server gave the wait %d: the others are held by nobody until their TTL ends", held)
	}
}

// A1, end to end: a waiting Acquire returns one permit while the server has given its wait
// two; the other is held by nobody for its whole TTL, and a try is refused meanwhile though
// only 2 of 3 permits are in use.
func TestSemaphoreGrantedAndHandedPermitLost(t *testing.T) {
	b, h, pa := permitHeld(t, "rv-a", "rv1g", 1, 20*time.Second)
	defer func() { _ = pa.Release(b.Ctx) }()
	w := newSemaphore(t, b, "rv-w", "rv1g", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
	// TTL 2 s: liveness 2 s, a refresh every 667 ms (the head's attempt, which runs the grant).
	got := fencetest.PermitAsync(b.Ctx, w, 2*time.Second)
	waitQueued(t, b, h, 1)
	time.Sleep(100 * time.Millisecond) // past the join recheck

	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	since := time.Now()
	rvExec(t, b.Ctx, tx, `SELECT fencelock.semaphore_set_limit('rv1g', 3)`)
	// W's next refresh blocks on the semaphore's row (held FOR UPDATE by SetLimit), or returns
	// at once (its row is locked by SetLimit's hand-off).
	rvWaitLockedOrDone(t, b, "SemaphoreAcquire", 5*time.Second, rvRanSince(b, "SemaphoreAcquire", since))
	require.NoError(t, tx.Commit(b.Ctx))
	r := fencetest.Receive(t, got, 5*time.Second)
	require.NoError(t, r.Err)
	defer func() { _ = r.Lease.Release(b.Ctx) }()

	var names []string
	rows, err := b.Pool.Query(b.Ctx, `SELECT name FROM fencelock.leases WHERE holder = 'rv-w' AND expires_at > clock_timestamp() ORDER BY name`)
	require.NoError(t, err)
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	t.Logf("Acquire returned %s; the server has W holding %v", r.Lease.Name(), names)
	_, tryErr := newSemaphore(t, b, "rv-z", "rv1g", 3).TryAcquire(b.Ctx, time.Second)
	require.Equal(t, []string{r.Lease.Name()}, names, "a permit given to the wait is held by nobody until its TTL ends (try: %v)", tryErr)
}

// A2. After a lowered limit, the release of a permit at or above the new limit is the one that
// lets a counting grant in, yet it wakes nobody (semaphore_release returns 1 before any wake):
// the head waiter finds the room only at its next refresh (a third of its liveness).
func TestSemaphoreReleaseAboveLoweredLimitWakesNobody(t *testing.T) {
	b, h, p0 := permitHeld(t, "rv2-h", "rv2", 2, 20*time.Second)
	p1, err := h.TryAcquire(b.Ctx, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, "rv2#1", p1.Name())
	_, err = h.SetLimit(b.Ctx, 1)
	require.NoError(t, err)
	w := newSemaphore(t, b, "rv2-w", "rv2", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
	got := fencetest.PermitAsync(b.Ctx, w, 10*time.Second)
	waitQueued(t, b, h, 1)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, p0.Release(b.Ctx)) // below the limit: freed, the head woken, still 1 held
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, p1.Release(b.Ctx)) // above the limit: now nothing is held
	released := time.Now()
	r := fencetest.Receive(t, got, 5*time.Second)
	require.NoError(t, r.Err)
	defer func() { _ = r.Lease.Release(b.Ctx) }()
	took := r.At.Sub(released)
	t.Logf("granted %v after the release that made room", took.Round(time.Millisecond))
	require.Less(t, took, 1200*time.Millisecond, "the release that made room woke nobody (the refresh is 1.67 s)")
}

// A3. A larger limit gives its new permits to the waiters (semaphore_dispatch), but stops at
// the first waiter whose row is locked (a waiter refreshing its place) and wakes nobody: the
// permit stays free while that waiter waits for its next refresh (1.67 s at a 5 s liveness).
func TestSemaphoreDispatchSkipsRefreshingWaiter(t *testing.T) {
	b, ctx := rvFull(t, "rv3", 20*time.Second, rvWait{"w1", 101, "rvc1"}, rvWait{"w2", 102, "rvc2"})
	collect := rvListen(t, b, "rvc1", "rvc2")

	tx, err := b.Pool.Begin(ctx) // W2 refreshing its place: its row is locked
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	ref := rvAcquire(t, ctx, tx, "rv3", "w2", 102, 20*time.Second, true, "rvc2")
	require.EqualValues(t, 4, ref.outcome)
	require.EqualValues(t, 1, ref.ahead, "W2's refresh sees W1 ahead: it sleeps until its next refresh")
	rvExec(t, ctx, b.Pool, `SELECT fencelock.semaphore_set_limit('rv3', 3)`)
	require.NoError(t, tx.Commit(ctx))

	ns := collect(time.Second)
	free := rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv3'`)
	w2 := rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_waiters WHERE wait_id = 102 AND expires_at > clock_timestamp()`)
	t.Logf("W1 told %q, W2 told %q; free permits %d, W2 waiting %d", rvOn(ns, "rvc1"), rvOn(ns, "rvc2"), free, w2)
	require.NotEmpty(t, rvOn(ns, "rvc2"), "a permit free (%d) and W2 waiting, and W2 never told", free)
}

// A4. Two releases at once with two waiters, the second refreshing its place: the first
// release hands its permit to W1; the second finds both rows locked, frees its permit and wakes
// "the head", W1, which is being given the other permit. W2, which its refresh told someone is
// ahead, is not told, and waits for its next refresh with the permit free. (00008 woke the
// first two waiters for this reason.)
func TestSemaphoreTwoReleasesLoseWake(t *testing.T) {
	b, ctx := rvSemaphore(t, "rv4", 2)
	pa := rvAcquire(t, ctx, b.Pool, "rv4", "a", 1, 20*time.Second, false, "")
	pb := rvAcquire(t, ctx, b.Pool, "rv4", "b", 2, 20*time.Second, false, "")
	require.EqualValues(t, 1, pa.outcome)
	require.EqualValues(t, 1, pb.outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rv4", "w1", 101, 20*time.Second, true, "rvd1").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rv4", "w2", 102, 20*time.Second, true, "rvd2").outcome)
	collect := rvListen(t, b, "rvd1", "rvd2")

	t1, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t1.Rollback(ctx) }()
	require.EqualValues(t, 3, rvInt(t, ctx, t1, `SELECT fencelock.semaphore_release('rv4', $1, 'a', $2)`, pa.name, pa.token), "given to W1")
	t2, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t2.Rollback(ctx) }()
	require.EqualValues(t, 4, rvAcquire(t, ctx, t2, "rv4", "w2", 102, 20*time.Second, true, "rvd2").outcome)
	r := rvInt(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rv4', $1, 'b', $2)`, pb.name, pb.token)
	require.NoError(t, t1.Commit(ctx))
	require.NoError(t, t2.Commit(ctx))

	ns := collect(time.Second)
	free := rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv4'`)
	t.Logf("second release: %d; W1 told %q, W2 told %q; free permits %d", r, rvOn(ns, "rvd1"), rvOn(ns, "rvd2"), free)
	require.NotEmpty(t, rvOn(ns, "rvd2"), "a permit free (%d) and W2 waiting, and W2 never told", free)
}

// A5. semaphore_give draws the token before its upsert and overwrites whatever row it meets
// (ON CONFLICT DO UPDATE without a WHERE). An operator's force_release of the free permit
// (which inserts a placeholder and fences its resources with a fresh token) that lands in
// between leaves the new grant with a token smaller than the one force_release recorded: the
// permit's tokens go backwards, and the new holder's fenced writes are refused. The trigger
// only widens the window between next_token and the insert (a slow or preempted backend).
func TestSemaphoreGiveTokenGoesBackwards(t *testing.T) {
	b, ctx := rvFull(t, "rv5", 20*time.Second, rvWait{"w", 100, ""})
	rvExec(t, ctx, b.Pool, `CREATE FUNCTION rv_slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.name = 'rv5#1' AND NEW.holder = 'w' THEN PERFORM pg_sleep(1); END IF;
			RETURN NEW;
		END $$`)
	rvExec(t, ctx, b.Pool, `CREATE TRIGGER rv_slow BEFORE INSERT ON fencelock.leases FOR EACH ROW EXECUTE FUNCTION rv_slow()`)

	done := make(chan error, 1)
	go func() {
		_, err := b.Pool.Exec(ctx, `SELECT fencelock.semaphore_set_limit('rv5', 2)`) // gives rv5#1 to W
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	var forced int64
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT new_token FROM fencelock.force_release('rv5#1', ARRAY['rv5-res'])`).Scan(&forced))
	require.NoError(t, <-done)
	var holder string
	var tok int64
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT holder, token FROM fencelock.leases WHERE name = 'rv5#1'`).Scan(&holder, &tok))
	t.Logf("force_release fenced with token %d; then rv5#1 granted to %s with token %d", forced, holder, tok)
	require.Greater(t, tok, forced, "a grant after force_release carries a smaller token than force_release recorded")
}

// A release that meets the head's row held by the head's own attempt (a refresh of its place,
// the recheck after it joined at the head, the new channel of a lessor that came to listen)
// gives the permit to nobody rather than to the waiter behind: the permit is free, the head
// alone is told to look again, the waiter behind is refused (the head is ahead), and the
// head's next attempt takes it. First come, first served. Before migration 00016, semaphore_give passed over the busy head and handed
// the permit to the second waiter (TestSemaphoreWaitersInOrder saw it under load). A head whose
// row another release holds (it is being given a permit) is still passed over.
func TestSemaphoreReleaseWhileHeadBusyKeepsOrder(t *testing.T) {
	t.Run("HeadsOwnAttempt", func(t *testing.T) {
		b, ctx := rvFull(t, "rvh", time.Minute, rvWait{"w1", 101, "rvh1"}, rvWait{"w2", 102, "rvh2"})
		tok := rvInt(t, ctx, b.Pool, `SELECT token FROM fencelock.leases WHERE name = 'rvh#0' AND holder = 'a'`)
		collect := rvListen(t, b, "rvh1", "rvh2")
		head, err := b.Pool.Begin(ctx) // the head's attempt, refused, its transaction still open
		require.NoError(t, err)
		defer func() { _ = head.Rollback(ctx) }()
		require.EqualValues(t, 4, rvAcquire(t, ctx, head, "rvh", "w1", 101, time.Minute, true, "rvh1").outcome)

		require.Positive(t, rvInt(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rvh', 'rvh#0', 'a', $1)`, tok))
		ns := collect(time.Second)
		require.Equal(t, []string{"101 0 0 2 w1rvh"}, rvOn(ns, "rvh1"), "the head is told to look again (token 0)")
		require.Empty(t, rvOn(ns, "rvh2"), "the waiter behind the head is not woken: it would only be refused")
		require.Zero(t, rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.leases WHERE permit_wait = 102 AND expires_at > clock_timestamp()`),
			"the release gave the permit to the waiter behind the head")
		require.EqualValues(t, 1, rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rvh' AND slot = 0`),
			"the permit is free for the head")
		require.EqualValues(t, 4, rvAcquire(t, ctx, b.Pool, "rvh", "w2", 102, time.Minute, true, "rvh2").outcome, "the waiter behind the head is refused")

		require.NoError(t, head.Commit(ctx))
		got := rvAcquire(t, ctx, b.Pool, "rvh", "w1", 101, time.Minute, true, "rvh1")
		require.EqualValues(t, 1, got.outcome, "the head takes the free permit")
		require.Equal(t, "rvh#0", got.name)
	})
	t.Run("HeadBeingGiven", func(t *testing.T) {
		b, ctx := rvFull(t, "rvg", time.Minute, rvWait{"w1", 101, ""}, rvWait{"w2", 102, ""})
		tok := rvInt(t, ctx, b.Pool, `SELECT token FROM fencelock.leases WHERE name = 'rvg#0' AND holder = 'a'`)
		other, err := b.Pool.Begin(ctx) // another release, giving the head a permit: its row FOR UPDATE
		require.NoError(t, err)
		defer func() { _ = other.Rollback(ctx) }()
		rvExec(t, ctx, other, `SELECT 1 FROM fencelock.semaphore_waiters WHERE semaphore = 'rvg' AND wait_id = 101 FOR UPDATE`)
		require.Positive(t, rvInt(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('rvg', 'rvg#0', 'a', $1)`, tok))
		require.EqualValues(t, 1, rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.leases WHERE permit_wait = 102 AND expires_at > clock_timestamp()`),
			"the release passes over a head being given a permit, to the next waiter")
	})
}
