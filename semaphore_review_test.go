package fencelock_test

// Adversarial review of the semaphore hand-off (migration 00012). Each TestReview* test fails
// while the defect it names is there.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/migrations"
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

func rvAcquireErr(ctx context.Context, q rvQuerier, sem, who string, wait int64, ttl time.Duration, queue bool, channel string) (rvAttempt, error) {
	var a rvAttempt
	err := q.QueryRow(ctx, `SELECT outcome, coalesce(name, ''), token, ahead, remaining_us
		FROM fencelock.semaphore_acquire($1, $2, $3, $4, 1, $5, $6, $7)`,
		sem, who, wait, ttl.Microseconds(), queue, channel, (5*time.Second).Microseconds()).
		Scan(&a.outcome, &a.name, &a.token, &a.ahead, &a.remaining)
	return a, err
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
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'
			  AND pid <> pg_backend_pid()`, what).Scan(&n)
		return err == nil && n > 0
	}, limit, 2*time.Millisecond, "no statement with %q waits for a lock", what)
}

// rvWaitLockedOrDone waits until some backend of b's database waits for a lock while running a
// statement with what, or done reports that the statement under test has returned (the
// redesign's attempts return at once where 00012's first version waited).
func rvWaitLockedOrDone(t *testing.T, b *bundle, what string, limit time.Duration, done func() bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		if done() {
			return true
		}
		var n int
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'
			  AND pid <> pg_backend_pid()`, what).Scan(&n)
		return err == nil && n > 0
	}, limit, 2*time.Millisecond, "no statement with %q waits for a lock, nor did it return", what)
}

// rvRanSince reports whether a backend of b's database other than the caller's last ran a
// statement with what that started after since and has finished.
func rvRanSince(b *bundle, what string, since time.Time) func() bool {
	return func() bool {
		var n int
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle' AND query LIKE '%' || $1 || '%'
			  AND query_start > $2 AND pid <> pg_backend_pid()`, what, since).Scan(&n)
		return err == nil && n > 0
	}
}

// rvListen returns a connection of b's pool that LISTENs on channels, and a func that collects
// the notifications it gets within d.
func rvListen(t *testing.T, b *bundle, channels ...string) func(d time.Duration) []*pgconn.Notification {
	t.Helper()
	c, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	conn := c.Hijack()
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, ch := range channels {
		_, err := conn.Exec(b.ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		require.NoError(t, err)
	}
	return func(d time.Duration) []*pgconn.Notification {
		var got []*pgconn.Notification
		deadline := time.Now().Add(d)
		for {
			ctx, cancel := context.WithDeadline(b.ctx, deadline)
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
func TestReviewSemGrantedAndHandedSameWaitSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv1', 1)`)
	require.EqualValues(t, 1, rvAcquire(t, ctx, b.pool, "rv1", "a", 1, 10*time.Second, false, "").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv1", "w", 100, 10*time.Second, true, "").outcome)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rvExec(t, ctx, tx, `SELECT fencelock.semaphore_set_limit('rv1', 3)`)
	require.EqualValues(t, 1, rvInt(t, ctx, tx, `SELECT count(*) FROM fencelock.leases WHERE permit_wait = 100`), "SetLimit handed W a permit")

	done := make(chan rvAttempt, 1)
	go func() {
		a, err := rvAcquireErr(ctx, b.pool, "rv1", "w", 100, 10*time.Second, true, "")
		if err != nil {
			t.Error(err)
		}
		done <- a
	}()
	rvWaitLockedOrDone(t, b, "semaphore_acquire", 5*time.Second, func() bool { return len(done) > 0 })
	require.NoError(t, tx.Commit(ctx))
	a := <-done
	held := rvInt(t, ctx, b.pool, `SELECT count(*) FROM fencelock.leases WHERE holder = 'w' AND expires_at > clock_timestamp()`)
	t.Logf("W's attempt: outcome %d, permit %q; permits the server has for W: %d", a.outcome, a.name, held)
	if a.outcome == 1 || a.outcome == 3 {
		require.EqualValues(t, 1, held, "the attempt returned one permit, the server gave the wait %d: the others are held by nobody until their TTL ends", held)
	}
}

// A1, end to end: a waiting Acquire returns one permit while the server has given its wait
// two; the other is held by nobody for its whole TTL, and a try is refused meanwhile though
// only 2 of 3 permits are in use.
func TestReviewSemGrantedAndHandedPermitLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newSemaphore(t, b, "rv-a", "rv1g", 1)
	pa, err := h.TryAcquire(b.ctx, 20*time.Second)
	require.NoError(t, err)
	defer func() { _ = pa.Release(b.ctx) }()
	w := newSemaphore(t, b, "rv-w", "rv1g", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
	// TTL 2 s: liveness 2 s, a refresh every 667 ms (the head's attempt, which runs the grant).
	got := permitAsync(b.ctx, w, 2*time.Second)
	waitQueued(t, b, h, 1)
	time.Sleep(100 * time.Millisecond) // past the join recheck

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	since := time.Now()
	rvExec(t, b.ctx, tx, `SELECT fencelock.semaphore_set_limit('rv1g', 3)`)
	// W's next refresh blocks on the semaphore's row (held FOR UPDATE by SetLimit), or returns
	// at once (its row is locked by SetLimit's hand-off).
	rvWaitLockedOrDone(t, b, "SemaphoreAcquire", 5*time.Second, rvRanSince(b, "SemaphoreAcquire", since))
	require.NoError(t, tx.Commit(b.ctx))
	r := receive(t, got, 5*time.Second)
	require.NoError(t, r.err)
	defer func() { _ = r.lease.Release(b.ctx) }()

	var names []string
	rows, err := b.pool.Query(b.ctx, `SELECT name FROM fencelock.leases WHERE holder = 'rv-w' AND expires_at > clock_timestamp() ORDER BY name`)
	require.NoError(t, err)
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	t.Logf("Acquire returned %s; the server has W holding %v", r.lease.Name(), names)
	_, tryErr := newSemaphore(t, b, "rv-z", "rv1g", 3).TryAcquire(b.ctx, time.Second)
	require.Equal(t, []string{r.lease.Name()}, names, "a permit given to the wait is held by nobody until its TTL ends (try: %v)", tryErr)
}

// A2. After a lowered limit, the release of a permit at or above the new limit is the one that
// lets a counting grant in, yet it wakes nobody (semaphore_release returns 1 before any wake):
// the head waiter finds the room only at its next refresh (a third of its liveness).
func TestReviewSemReleaseAboveLoweredLimitWakesNobody(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newSemaphore(t, b, "rv2-h", "rv2", 2)
	p0, err := h.TryAcquire(b.ctx, 20*time.Second)
	require.NoError(t, err)
	p1, err := h.TryAcquire(b.ctx, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, "rv2#1", p1.Name())
	_, err = h.SetLimit(b.ctx, 1)
	require.NoError(t, err)
	w := newSemaphore(t, b, "rv2-w", "rv2", 1, fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second)))
	got := permitAsync(b.ctx, w, 10*time.Second)
	waitQueued(t, b, h, 1)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, p0.Release(b.ctx)) // below the limit: freed, the head woken, still 1 held
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, p1.Release(b.ctx)) // above the limit: now nothing is held
	released := time.Now()
	r := receive(t, got, 5*time.Second)
	require.NoError(t, r.err)
	defer func() { _ = r.lease.Release(b.ctx) }()
	took := r.at.Sub(released)
	t.Logf("granted %v after the release that made room", took.Round(time.Millisecond))
	require.Less(t, took, 1200*time.Millisecond, "the release that made room woke nobody (the refresh is 1.67 s)")
}

// A3. A larger limit gives its new permits to the waiters (semaphore_dispatch), but stops at
// the first waiter whose row is locked (a waiter refreshing its place) and wakes nobody: the
// permit stays free while that waiter waits for its next refresh (1.67 s at a 5 s liveness).
func TestReviewSemDispatchSkipsRefreshingWaiter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv3', 1)`)
	require.EqualValues(t, 1, rvAcquire(t, ctx, b.pool, "rv3", "a", 1, 20*time.Second, false, "").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv3", "w1", 101, 20*time.Second, true, "rvc1").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv3", "w2", 102, 20*time.Second, true, "rvc2").outcome)
	collect := rvListen(t, b, "rvc1", "rvc2")

	tx, err := b.pool.Begin(ctx) // W2 refreshing its place: its row is locked
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	ref := rvAcquire(t, ctx, tx, "rv3", "w2", 102, 20*time.Second, true, "rvc2")
	require.EqualValues(t, 4, ref.outcome)
	require.EqualValues(t, 1, ref.ahead, "W2's refresh sees W1 ahead: it sleeps until its next refresh")
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv3', 3)`)
	require.NoError(t, tx.Commit(ctx))

	ns := collect(time.Second)
	free := rvInt(t, ctx, b.pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv3'`)
	w2 := rvInt(t, ctx, b.pool, `SELECT count(*) FROM fencelock.semaphore_waiters WHERE wait_id = 102 AND expires_at > clock_timestamp()`)
	t.Logf("W1 told %q, W2 told %q; free permits %d, W2 waiting %d", rvOn(ns, "rvc1"), rvOn(ns, "rvc2"), free, w2)
	require.NotEmpty(t, rvOn(ns, "rvc2"), "a permit free (%d) and W2 waiting, and W2 never told", free)
}

// A4. Two releases at once with two waiters, the second refreshing its place: the first
// release hands its permit to W1; the second finds both rows locked, frees its permit and wakes
// "the head", W1, which is being given the other permit. W2, which its refresh told someone is
// ahead, is not told, and waits for its next refresh with the permit free. (00008 woke the
// first two waiters for this reason.)
func TestReviewSemTwoReleasesLoseWake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv4', 2)`)
	pa := rvAcquire(t, ctx, b.pool, "rv4", "a", 1, 20*time.Second, false, "")
	pb := rvAcquire(t, ctx, b.pool, "rv4", "b", 2, 20*time.Second, false, "")
	require.EqualValues(t, 1, pa.outcome)
	require.EqualValues(t, 1, pb.outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv4", "w1", 101, 20*time.Second, true, "rvd1").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv4", "w2", 102, 20*time.Second, true, "rvd2").outcome)
	collect := rvListen(t, b, "rvd1", "rvd2")

	t1, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t1.Rollback(ctx) }()
	require.EqualValues(t, 3, rvInt(t, ctx, t1, `SELECT fencelock.semaphore_release('rv4', $1, 'a', $2)`, pa.name, pa.token), "given to W1")
	t2, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t2.Rollback(ctx) }()
	require.EqualValues(t, 4, rvAcquire(t, ctx, t2, "rv4", "w2", 102, 20*time.Second, true, "rvd2").outcome)
	r := rvInt(t, ctx, b.pool, `SELECT fencelock.semaphore_release('rv4', $1, 'b', $2)`, pb.name, pb.token)
	require.NoError(t, t1.Commit(ctx))
	require.NoError(t, t2.Commit(ctx))

	ns := collect(time.Second)
	free := rvInt(t, ctx, b.pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv4'`)
	t.Logf("second release: %d; W1 told %q, W2 told %q; free permits %d", r, rvOn(ns, "rvd1"), rvOn(ns, "rvd2"), free)
	require.NotEmpty(t, rvOn(ns, "rvd2"), "a permit free (%d) and W2 waiting, and W2 never told", free)
}

// A5. semaphore_give draws the token before its upsert and overwrites whatever row it meets
// (ON CONFLICT DO UPDATE without a WHERE). An operator's force_release of the free permit
// (which inserts a placeholder and fences its resources with a fresh token) that lands in
// between leaves the new grant with a token smaller than the one force_release recorded: the
// permit's tokens go backwards, and the new holder's fenced writes are refused. The trigger
// only widens the window between next_token and the insert (a slow or preempted backend).
func TestReviewSemGiveTokenGoesBackwards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `CREATE FUNCTION rv_slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.name = 'rv5#1' AND NEW.holder = 'w' THEN PERFORM pg_sleep(1); END IF;
			RETURN NEW;
		END $$`)
	rvExec(t, ctx, b.pool, `CREATE TRIGGER rv_slow BEFORE INSERT ON fencelock.leases FOR EACH ROW EXECUTE FUNCTION rv_slow()`)
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv5', 1)`)
	require.EqualValues(t, 1, rvAcquire(t, ctx, b.pool, "rv5", "a", 1, 20*time.Second, false, "").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv5", "w", 100, 20*time.Second, true, "").outcome)

	done := make(chan error, 1)
	go func() {
		_, err := b.pool.Exec(ctx, `SELECT fencelock.semaphore_set_limit('rv5', 2)`) // gives rv5#1 to W
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	var forced int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT new_token FROM fencelock.force_release('rv5#1', ARRAY['rv5-res'])`).Scan(&forced))
	require.NoError(t, <-done)
	var holder string
	var tok int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT holder, token FROM fencelock.leases WHERE name = 'rv5#1'`).Scan(&holder, &tok))
	t.Logf("force_release fenced with token %d; then rv5#1 granted to %s with token %d", forced, holder, tok)
	require.Greater(t, tok, forced, "a grant after force_release carries a smaller token than force_release recorded")
}

// rvSpan is one grant of a permit as logged: its start and its last expiry.
type rvSpan struct {
	name     string
	token    int64
	from, to time.Time
	limit    int
}

// rvInstallLog logs every version of the permit rows of sem, with the limit in force for the
// statement that wrote it.
func rvInstallLog(t *testing.T, b *bundle, sem string) {
	t.Helper()
	rvExec(t, b.ctx, b.pool, `CREATE TABLE rv_log (id bigserial PRIMARY KEY, name text, holder text, token bigint,
		acquired_at timestamptz, expires_at timestamptz, lim int)`)
	rvExec(t, b.ctx, b.pool, fmt.Sprintf(`CREATE FUNCTION rv_log() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO rv_log (name, holder, token, acquired_at, expires_at, lim)
			VALUES (NEW.name, NEW.holder, NEW.token, NEW.acquired_at, NEW.expires_at,
			        (SELECT s.permit_limit FROM fencelock.semaphores AS s WHERE s.name = %s));
			RETURN NULL;
		END $$`, quoteLiteral(sem)))
	rvExec(t, b.ctx, b.pool, fmt.Sprintf(`CREATE TRIGGER rv_log AFTER INSERT OR UPDATE ON fencelock.leases FOR EACH ROW
		WHEN (NEW.name LIKE %s) EXECUTE FUNCTION rv_log()`, quoteLiteral(sem+"#%")))
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// rvCheckLog returns the grants that started while their limit (or more) of other grants were
// unexpired on the database clock.
func rvCheckLog(t *testing.T, b *bundle) (spans []rvSpan, bad []string) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT name, token, min(acquired_at),
		(array_agg(expires_at ORDER BY id DESC))[1], (array_agg(lim ORDER BY id))[1]
		FROM rv_log WHERE holder <> 'fencelock force-release' GROUP BY name, token`)
	require.NoError(t, err)
	for rows.Next() {
		var s rvSpan
		require.NoError(t, rows.Scan(&s.name, &s.token, &s.from, &s.to, &s.limit))
		spans = append(spans, s)
	}
	require.NoError(t, rows.Err())
	for _, g := range spans {
		n := 0
		for _, h := range spans {
			if !h.from.After(g.from) && g.from.Before(h.to) {
				n++
			}
		}
		if n > g.limit {
			bad = append(bad, fmt.Sprintf("%s token %d at %s: %d unexpired, limit %d", g.name, g.token, g.from.Format("15:04:05.000000"), n, g.limit))
		}
	}
	return spans, bad
}

// rvPool returns a pool on b's database with room for a stress test.
func rvPool(t *testing.T, b *bundle, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Promise 1 and 2 under load: many Acquire (some cut short mid-statement), TryAcquire and
// Release, SetLimit up and down, permits lost by TTL, guarded transactions held across their
// permit's expiry, and force_release of held permits. Checked: never more than the limit of
// permits unexpired at once (from a log of every version of the permit rows), tokens of each
// permit rising, and no permit trusted by its client while the server no longer has it
// (force-released ones aside).
func TestReviewSemStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sem = "rvs"
	rvInstallLog(t, b, sem)
	pool := rvPool(t, b, 40)
	_, err := b.pool.Exec(b.ctx, `SELECT fencelock.semaphore_set_limit($1, 3)`, sem)
	require.NoError(t, err)
	deadline := time.Now().Add(8 * time.Second)
	var forcedMu sync.Mutex
	forced := map[int64]bool{}
	var grants, trusted, cut, refusedTry, goneForced atomic.Int64
	var wg sync.WaitGroup
	for li := range 4 {
		l := newLessor(t, pool, fmt.Sprintf("rvs-l%d", li), fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, 50*time.Millisecond)))
		s, err := fencelock.NewSemaphore(l, sem, 3)
		require.NoError(t, err)
		for g := range 3 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(li), uint64(g)))
				for time.Now().Before(deadline) {
					var p *fencelock.Lease
					var err error
					switch k := rng.IntN(10); {
					case k < 5:
						ctx, cancel := context.WithTimeout(b.ctx, time.Duration(5+rng.IntN(300))*time.Millisecond)
						p, err = s.Acquire(ctx, 500*time.Millisecond)
						cancel()
					case k < 8:
						p, err = s.TryAcquire(b.ctx, 500*time.Millisecond)
						if err != nil {
							refusedTry.Add(1)
						}
					default:
						ctx, cancel := context.WithTimeout(b.ctx, time.Duration(100+rng.IntN(1500))*time.Microsecond)
						p, err = s.Acquire(ctx, 500*time.Millisecond)
						cancel()
						if err != nil {
							cut.Add(1)
						}
					}
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					grants.Add(1)
					hold := time.Now().Add(time.Duration(rng.IntN(15)) * time.Millisecond)
					for time.Now().Before(hold) {
						if p.Err() != nil {
							break
						}
						until := p.TrustedUntil()
						sent := time.Now()
						var n int
						err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM fencelock.leases WHERE name = $1 AND token = $2 AND holder = $3
							AND expires_at > clock_timestamp()`, p.Name(), int64(p.Token()), l.Holder()).Scan(&n)
						if err != nil {
							t.Error(err)
							return
						}
						trusted.Add(1)
						forcedMu.Lock()
						f := forced[int64(p.Token())]
						forcedMu.Unlock()
						if n == 0 && f {
							goneForced.Add(1)
						}
						if n == 0 && sent.Before(until) && !f {
							t.Errorf("permit %s token %d trusted by %s until %v, gone on the server at %v", p.Name(), p.Token(), l.Holder(), until.Format("15:04:05.000"), sent.Format("15:04:05.000"))
						}
						time.Sleep(3 * time.Millisecond)
					}
					_ = p.Release(b.ctx)
				}
			})
		}
	}
	// Permits lost by their TTL: never renewed, never released.
	dead, err := fencelock.NewSemaphore(newLessor(t, pool, "rvs-dead", fencelock.WithoutHeartbeat()), sem, 3)
	require.NoError(t, err)
	wg.Go(func() {
		for time.Now().Before(deadline) {
			_, _ = dead.TryAcquire(b.ctx, 80*time.Millisecond)
			time.Sleep(150 * time.Millisecond)
		}
	})
	// A guarded transaction held open across its permit's expiry.
	gs, err := fencelock.NewSemaphore(newLessor(t, pool, "rvs-guard", fencelock.WithoutHeartbeat()), sem, 3)
	require.NoError(t, err)
	wg.Go(func() {
		for time.Now().Before(deadline) {
			p, err := gs.TryAcquire(b.ctx, 100*time.Millisecond)
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			tx, err := pool.Begin(b.ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if p.GuardTx(b.ctx, tx) == nil {
				time.Sleep(250 * time.Millisecond)
			}
			_ = tx.Commit(b.ctx)
		}
	})
	// SetLimit up and down.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		for time.Now().Before(deadline) {
			if _, err := pool.Exec(b.ctx, `SELECT fencelock.semaphore_set_limit($1, $2)`, sem, 1+rng.IntN(5)); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		}
	})
	// An operator's force_release of a held permit.
	wg.Go(func() {
		for time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			var name string
			var tok int64
			err := pool.QueryRow(b.ctx, `SELECT name, token FROM fencelock.leases WHERE name LIKE 'rvs#%' AND expires_at > clock_timestamp()
				ORDER BY random() LIMIT 1`).Scan(&name, &tok)
			if err != nil {
				continue
			}
			forcedMu.Lock()
			forced[tok] = true
			forcedMu.Unlock()
			_ = pgx.BeginFunc(b.ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(b.ctx, `SET LOCAL lock_timeout = '500ms'`); err != nil {
					return err
				}
				_, err := tx.Exec(b.ctx, `SELECT * FROM fencelock.force_release($1, '{}', $2)`, name, tok)
				return err
			})
		}
	})
	wg.Wait()
	spans, bad := rvCheckLog(t, b)
	t.Logf("%d grants by the workers (%d tries refused, %d attempts cut short), %d trust checks (%d found a force-released permit gone), %d grants logged",
		grants.Load(), refusedTry.Load(), cut.Load(), trusted.Load(), goneForced.Load(), len(spans))
	require.Empty(t, bad, "more permits unexpired at once than the limit")
	rows, err := b.pool.Query(b.ctx, `SELECT name, token, lag(token) OVER (PARTITION BY name ORDER BY id) FROM rv_log`)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		var tok int64
		var prev *int64
		require.NoError(t, rows.Scan(&name, &tok, &prev))
		if prev != nil && tok < *prev {
			t.Errorf("permit %s: token %d after %d", name, tok, *prev)
		}
	}
	require.NoError(t, rows.Err())
}

// The log check of TestReviewSemStress catches a grant over the limit.
func TestReviewSemStressCheckerCatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rvInstallLog(t, b, "rvk")
	rvExec(t, b.ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rvk', 1)`)
	rvExec(t, b.ctx, b.pool, `INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
		VALUES ('rvk#0', 'x', fencelock.next_token(false), clock_timestamp(), clock_timestamp() + interval '1 minute'),
		       ('rvk#1', 'y', fencelock.next_token(false), clock_timestamp(), clock_timestamp() + interval '1 minute')`)
	_, bad := rvCheckLog(t, b)
	require.Len(t, bad, 1)
}

// Promise 5: no waiter's statement waits for a lock behind another waiter's. 32 waits on a
// semaphore of 2 (short liveness, so they refresh often) while a sampler looks for semaphore
// statements waiting for a lock, and what blocks them.
func TestReviewSemNoWaiterWaitsForAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sem = "rvw"
	pool := rvPool(t, b, 40)
	// The semaphore's row first: concurrent first acquires wait once for its creation.
	rvExec(t, b.ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rvw', 2)`)
	deadline := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	var grants atomic.Int64
	for li := range 4 {
		s, err := fencelock.NewSemaphore(newLessor(t, pool, fmt.Sprintf("rvw-l%d", li)), sem, 2)
		require.NoError(t, err)
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithDeadline(b.ctx, deadline)
					p, err := s.Acquire(ctx, 300*time.Millisecond)
					cancel()
					if err != nil {
						continue
					}
					grants.Add(1)
					time.Sleep(2 * time.Millisecond)
					_ = p.Release(b.ctx)
				}
			})
		}
	}
	seen := map[string]int{}
	samples := 0
	for time.Now().Before(deadline) {
		rows, err := b.pool.Query(b.ctx, `SELECT a.query, coalesce(bl.query, '?'), a.wait_event, coalesce(bl.state, '?'),
				coalesce((SELECT string_agg(DISTINCT k.locktype || coalesce(':' || k.relation::regclass::text, ''), ',') FROM pg_locks AS k WHERE k.pid = a.pid AND (NOT k.granted OR k.locktype = 'tuple')), '')
			FROM pg_stat_activity AS a
			LEFT JOIN LATERAL unnest(pg_blocking_pids(a.pid)) AS p(pid) ON true
			LEFT JOIN pg_stat_activity AS bl ON bl.pid = p.pid AND bl.datname = a.datname
			WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND a.query LIKE '%semaphore%'`)
		require.NoError(t, err)
		for rows.Next() {
			var q, by, ev, st, lk string
			require.NoError(t, rows.Scan(&q, &by, &ev, &st, &lk))
			seen[rvStmt(q)+" <- "+rvStmt(by)+" ("+ev+" "+lk+", blocker "+st+")"]++
		}
		require.NoError(t, rows.Err())
		samples++
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("%d grants, %d samples; lock waits: %v", grants.Load(), samples, seen)
	for k, n := range seen {
		if strings.HasPrefix(k, "SemaphoreAcquire <- SemaphoreAcquire") && !strings.Contains(k, "(extend") {
			t.Errorf("a waiter's statement waited behind another waiter's %d times (%s)", n, k)
		}
	}
}

// rvStmt names a statement of the library by its sqlc name.
func rvStmt(q string) string {
	if i := strings.Index(q, "-- name: "); i >= 0 {
		f := strings.Fields(q[i+len("-- name: "):])
		if len(f) > 0 {
			return f[0]
		}
	}
	if len(q) > 60 {
		q = q[:60]
	}
	return q
}

// Migration 00012 down and up again with a semaphore in use (permits held above a lowered
// limit, a waiter queued): both directions apply, and the semaphore works on each side.
func TestReviewSemMigrationDownUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rm', 3)`)
	var ps []rvAttempt
	for i := range 3 {
		p := rvAcquire(t, ctx, b.pool, "rm", fmt.Sprint("h", i), int64(i+1), time.Minute, false, "")
		require.EqualValues(t, 1, p.outcome)
		ps = append(ps, p)
	}
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rm', 2)`)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rm", "w", 100, time.Minute, true, "").outcome)

	db := stdlib.OpenDBFromPool(b.pool)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(fencelock.VersionTable), goose.WithDisableGlobalRegistry(true), goose.WithLogger(goose.NopLogger()))
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 11)
	require.NoError(t, err)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rm", "x", 200, time.Minute, false, "").outcome, "3 held, limit 2")
	require.EqualValues(t, 1, rvInt(t, ctx, b.pool, `SELECT fencelock.semaphore_release('rm', $1, 'h2', $2)`, ps[2].name, ps[2].token), "released (00008)")
	_, err = b.pool.Exec(ctx, `SELECT fencelock.semaphore_leave('rm', 200)`)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 12)
	require.NoError(t, err)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rm", "x", 201, time.Minute, false, "").outcome, "2 held, limit 2")
	r := rvInt(t, ctx, b.pool, `SELECT fencelock.semaphore_release('rm', $1, 'h0', $2)`, ps[0].name, ps[0].token)
	w := rvAcquire(t, ctx, b.pool, "rm", "w", 100, time.Minute, true, "")
	t.Logf("after down and up: release %d, the waiter's attempt %d %q", r, w.outcome, w.name)
	require.Contains(t, []int32{1, 3}, w.outcome, "the waiter at the head, one permit free, limit 2: granted")
	require.EqualValues(t, 2, rvInt(t, ctx, b.pool, `SELECT held FROM fencelock.semaphore_state WHERE name = 'rm'`))
}

// A6. After a lowered limit (counting grants), a grant that leaves room for more wakes nobody
// (semaphore_acquire dispatches only when not counting; 00008 woke the next waiter when
// permits were left): three permits released at once wake the head only, which takes one;
// the waiter behind it waits for its next refresh with two permits free.
func TestReviewSemCountingGrantLeavesRoomUntold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv6', 5)`)
	var ps []rvAttempt
	for i := range 5 {
		p := rvAcquire(t, ctx, b.pool, "rv6", fmt.Sprint("h", i), int64(i+1), time.Minute, false, "")
		require.EqualValues(t, 1, p.outcome)
		ps = append(ps, p)
	}
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv6', 4)`) // rv6#4 held above it: counting
	slow := fencelock.WithBackoff(fencelock.ExponentialBackoff(5*time.Second, 5*time.Second))
	w1 := newSemaphore(t, b, "rv6-w1", "rv6", 5, slow)
	w2 := newSemaphore(t, b, "rv6-w2", "rv6", 5, slow)
	g1 := permitAsync(ctx, w1, 10*time.Second)
	waitQueued(t, b, w1, 1)
	g2 := permitAsync(ctx, w2, 10*time.Second)
	waitQueued(t, b, w1, 2)
	time.Sleep(100 * time.Millisecond) // past the join rechecks
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for i := range 3 { // three holders finish at once
		rvExec(t, ctx, tx, `SELECT fencelock.semaphore_release('rv6', $1, $2, $3)`, ps[i].name, fmt.Sprint("h", i), ps[i].token)
	}
	require.NoError(t, tx.Commit(ctx))
	released := time.Now()
	r1 := receive(t, g1, 5*time.Second)
	require.NoError(t, r1.err)
	r2 := receive(t, g2, 5*time.Second)
	require.NoError(t, r2.err)
	t.Logf("W1 granted %v, W2 %v after the releases (2 of 4 held before them)", r1.at.Sub(released).Round(time.Millisecond), r2.at.Sub(released).Round(time.Millisecond))
	require.Less(t, r2.at.Sub(released), 1200*time.Millisecond, "W2 was not told of the room W1's grant left (the refresh is 1.67 s)")
}

// A7. semaphore_acquire reads t once, at its start, and later treats a free permit whose row
// expired after t as "held after all": it deletes it from the free set. A grant that waited
// (here: its reclaim's insert into the free set waits for another grant's commit, as a grant
// commits synchronously for its token) meanwhile sees a release free a permit after t, pops
// it, and throws it away: the try is refused with a permit free and nobody waiting, and so is
// every attempt until next_reclaim (up to a second later).
func TestReviewSemStaleClockDropsFreePermit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv7', 3)`)
	pa := rvAcquire(t, ctx, b.pool, "rv7", "a", 1, time.Minute, false, "")
	pb := rvAcquire(t, ctx, b.pool, "rv7", "b", 2, time.Minute, false, "")
	require.Equal(t, "rv7#0", pa.name)
	require.Equal(t, "rv7#1", pb.name)

	x, err := b.pool.Begin(ctx) // a grant whose commit is slow
	require.NoError(t, err)
	defer func() { _ = x.Rollback(ctx) }()
	require.Equal(t, "rv7#2", rvAcquire(t, ctx, x, "rv7", "x", 3, time.Minute, false, "").name)

	done := make(chan rvAttempt, 1)
	go func() {
		a, err := rvAcquireErr(ctx, b.pool, "rv7", "g", 4, time.Minute, false, "")
		if err != nil {
			t.Error(err)
		}
		done <- a
	}()
	rvWaitLockedOrDone(t, b, "semaphore_acquire", 5*time.Second, func() bool { return len(done) > 0 })
	// A releases rv7#0 while G waits: nobody waits, so it goes to the free set.
	require.EqualValues(t, 1, rvInt(t, ctx, b.pool, `SELECT fencelock.semaphore_release('rv7', $1, 'a', $2)`, pa.name, pa.token))
	require.NoError(t, x.Commit(ctx))
	g := <-done
	h := rvAcquire(t, ctx, b.pool, "rv7", "h", 5, time.Minute, false, "")
	free := rvInt(t, ctx, b.pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv7' AND slot = 0`)
	t.Logf("G: outcome %d %q; a try right after: outcome %d %q; rv7#0 in the free set: %d", g.outcome, g.name, h.outcome, h.name, free)
	require.True(t, g.outcome == 1 || h.outcome == 1, "two tries refused with rv7#0 free (2 of 3 permits held, nobody waiting)")
}

// A8. A waiter's refresh waits for another waiter's grant statement: the head's grant gives
// the permits left free to the waiters behind it (semaphore_dispatch, in the head's
// transaction), locking and deleting their queue rows; a waiter refreshing its place at that
// moment (INSERT ... ON CONFLICT on its row) waits until the head's transaction ends, its
// synchronous commit and the NOTIFY queue's lock included. (TestReviewSemNoWaiterWaitsForAnother
// sees it under load: up to 141 samples, 2 ms apart, of one SemaphoreAcquire waiting on
// another's transaction.)
func TestReviewSemRefreshWaitsForHeadsGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rv8', 2)`)
	pa := rvAcquire(t, ctx, b.pool, "rv8", "a", 1, time.Minute, false, "")
	pb := rvAcquire(t, ctx, b.pool, "rv8", "b", 2, time.Minute, false, "")
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv8", "w1", 101, time.Minute, true, "").outcome)
	require.EqualValues(t, 4, rvAcquire(t, ctx, b.pool, "rv8", "w2", 102, time.Minute, true, "").outcome)
	// Free permits while both wait: two releases that met both queue rows locked (both
	// waiters refreshing: the lock of their INSERT ... ON CONFLICT DO UPDATE).
	locks, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locks.Rollback(ctx) }()
	rvExec(t, ctx, locks, `SELECT 1 FROM fencelock.semaphore_waiters WHERE semaphore = 'rv8' FOR UPDATE`)
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_release('rv8', $1, 'a', $2)`, pa.name, pa.token)
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_release('rv8', $1, 'b', $2)`, pb.name, pb.token)
	require.NoError(t, locks.Commit(ctx))
	require.EqualValues(t, 2, rvInt(t, ctx, b.pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'rv8'`))

	head, err := b.pool.Begin(ctx) // W1's attempt: granted, and it gives W2 a permit
	require.NoError(t, err)
	defer func() { _ = head.Rollback(ctx) }()
	require.EqualValues(t, 1, rvAcquire(t, ctx, head, "rv8", "w1", 101, time.Minute, true, "").outcome)
	start := time.Now()
	done := make(chan rvAttempt, 1)
	go func() {
		a, err := rvAcquireErr(ctx, b.pool, "rv8", "w2", 102, time.Minute, true, "")
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
func TestReviewSemCostAfterLowerLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	const n = 10_000
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rvc', $1)`, n)
	// n-2 permits held for an hour (as TryAcquires would leave them), slots 0 and 1 free.
	rvExec(t, ctx, b.pool, `INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
		SELECT 'rvc#' || i, 'filler', fencelock.next_token(false), clock_timestamp(), clock_timestamp() + interval '1 hour'
		FROM generate_series(2, $1 - 1) AS i`, n)
	rvExec(t, ctx, b.pool, `DELETE FROM fencelock.semaphore_free WHERE semaphore = 'rvc' AND slot > 1`)
	rvExec(t, ctx, b.pool, `VACUUM ANALYZE fencelock.leases`)
	l := newLessor(t, b.pool, "rvc-l")
	s, err := fencelock.NewSemaphore(l, "rvc", n)
	require.NoError(t, err)
	measure := func() time.Duration {
		const k = 50
		start := time.Now()
		for range k {
			p, err := s.TryAcquire(ctx, time.Minute)
			require.NoError(t, err)
			require.NoError(t, p.Release(ctx))
		}
		return time.Since(start) / k
	}
	measure()
	before := measure()
	_, err = s.SetLimit(ctx, n-1) // rvc#9999 stays held: counting until it ends
	require.NoError(t, err)
	after := measure()
	t.Logf("grant + release at limit %d: %v; after lowering the limit by one: %v (x%.1f)", n, before, after, float64(after)/float64(before))
}

// Cost while an expired permit's row is locked (its old holder's guarded transaction still
// open): semaphore_reclaim returns t ("reclaim again soon"), so every attempt that finds no
// free permit reads all permits again: O(limit) per refused try, not once a second.
func TestReviewSemCostReclaimWhileGuarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	const n = 10_000
	rvExec(t, ctx, b.pool, `SELECT fencelock.semaphore_set_limit('rvg', $1)`, n)
	rvExec(t, ctx, b.pool, `INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
		SELECT 'rvg#' || i, 'filler', fencelock.next_token(false), clock_timestamp(),
		       clock_timestamp() + CASE WHEN i = 0 THEN interval '0' ELSE interval '1 hour' END
		FROM generate_series(0, $1 - 1) AS i`, n)
	rvExec(t, ctx, b.pool, `DELETE FROM fencelock.semaphore_free WHERE semaphore = 'rvg'`)
	rvExec(t, ctx, b.pool, `VACUUM ANALYZE fencelock.leases`)
	s, err := fencelock.NewSemaphore(newLessor(t, b.pool, "rvg-l"), "rvg", n)
	require.NoError(t, err)
	measure := func() time.Duration {
		const k = 40
		start := time.Now()
		for range k {
			_, err := s.TryAcquire(ctx, time.Minute)
			require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		}
		return time.Since(start) / k
	}
	// rvg#0 expired, its row locked FOR KEY SHARE (as GuardTx holds it).
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rvExec(t, ctx, tx, `SELECT 1 FROM fencelock.leases WHERE name = 'rvg#0' FOR KEY SHARE`)
	measure()
	guarded := measure()
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
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT next_reclaim, clock_timestamp() FROM fencelock.semaphores WHERE name = 'rvg'`).Scan(&nr, &now))
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
	var p *fencelock.Lease
	require.Eventually(t, func() bool {
		p, err = s.TryAcquire(ctx, time.Hour)
		return err == nil
	}, 2*time.Second, 10*time.Millisecond, "the expired permit is reclaimed once its guard ends")
	defer func() { _ = p.Release(ctx) }()
	measure()
	full := measure()
	t.Logf("refused try at limit %d, all held: %v; with one expired permit guarded: %v (x%.1f)", n, full, guarded, float64(guarded)/float64(full))
}
