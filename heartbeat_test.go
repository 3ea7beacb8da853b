package fencelock_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/testkit"
)

// doneLateness waits up to limit for lease's Done and returns how much later than the end of
// its trust window (TrustedUntil, read once Done has closed: the window that ended) it closed,
// beyond the scheduler's delay meanwhile, and that delay (sched). A control timer of this
// goroutine, re-armed every 10 ms while it waits, measures the delay (a loaded 2-core machine
// under -race delays every timer, the library's trust watch and this goroutine's wake-up on
// Done alike): its worst lateness after the window's end, each firing counted from the later
// of its due time and that end, and the firing still pending when Done is seen closed counted
// for how overdue it is then (this goroutine was not running). So late is what the library
// adds (a heartbeat busy elsewhere, a lock), whatever the load, plus what the control timer
// could not see: the library's own work on the closing's path, and a second stall on that path
// beyond the worst one.
func doneLateness(t *testing.T, lease *fencelock.Lease, limit time.Duration) (late, sched time.Duration) {
	t.Helper()
	const period = 10 * time.Millisecond
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	control := time.NewTimer(period)
	defer control.Stop()
	type firing struct{ due, seen time.Time }
	var firings []firing
	due := time.Now().Add(period)
	for {
		select {
		case <-lease.Done():
			closed := time.Now()
			until := lease.TrustedUntil()
			lateness := func(f firing) time.Duration {
				if f.due.Before(until) {
					f.due = until
				}
				return max(0, f.seen.Sub(f.due))
			}
			sched = lateness(firing{due, closed})
			for _, f := range firings {
				sched = max(sched, lateness(f))
			}
			return max(0, closed.Sub(until)-sched), sched
		case <-control.C:
			firings = append(firings, firing{due, time.Now()})
			due = time.Now().Add(period)
			control.Reset(period)
		case <-deadline.C:
			t.Errorf("lease %q: Done not closed within %v", lease.Name(), limit) // Errorf: may run in a goroutine of the test's
			return limit, 0
		}
	}
}

// maxDoneLateness is how late past the end of its trust window a Done may close in these
// tests, beyond the scheduler's delay a control timer saw meanwhile (doneLateness): the
// library's own work on the closing's path, and a wake-up the control timer could not see.
const maxDoneLateness = 50 * time.Millisecond

// Done closes at the end of the trust window while the heartbeat is busy with another lease's
// renewal. Lease "long" (TTL 4 s, heartbeat 1.33 s) comes due at 1.0 to 1.33 s; lease "short"
// (TTL 2.4 s, heartbeat 0.8 s, granted at 0.9 s) comes due only at 1.5 to 1.7 s and its window
// ends at 3.06 s. From 1.1 s every renewal is blocked: by a table lock, or by a pool the
// application has exhausted. Before the trust watch, the heartbeat sat in long's renewal
// (started at 1.33 s) until long's window ended (3.6 s), and short's Done closed 0.54 s late.
func TestDoneOnTimeWhileHeartbeatBusy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc  string
		block func(t *testing.T, ctx context.Context, b *bundle, pool *pgxpool.Pool) (unblock func())
	}{
		{"TableLocked", func(t *testing.T, ctx context.Context, b *bundle, _ *pgxpool.Pool) func() {
			tx, err := b.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `LOCK TABLE fencelock.leases IN EXCLUSIVE MODE`)
			require.NoError(t, err)
			return func() { _ = tx.Rollback(ctx) }
		}},
		{"PoolExhausted", func(t *testing.T, ctx context.Context, _ *bundle, pool *pgxpool.Pool) func() {
			var conns []*pgxpool.Conn
			for range int(pool.Config().MaxConns) {
				c, err := pool.Acquire(ctx)
				require.NoError(t, err)
				conns = append(conns, c)
			}
			return func() {
				for _, c := range conns {
					c.Release()
				}
			}
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg, err := pgxpool.ParseConfig(b.DB.URL)
			require.NoError(t, err)
			cfg.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			l := newLessor(t, pool, "busy")

			start := time.Now()
			long, err := l.TryAcquire(b.Ctx, "long", 4*time.Second)
			require.NoError(t, err)
			time.Sleep(time.Until(start.Add(900 * time.Millisecond))) // staging the schedule, not awaiting an event
			short, err := l.TryAcquire(b.Ctx, "short", 2400*time.Millisecond)
			require.NoError(t, err)
			time.Sleep(time.Until(start.Add(1100 * time.Millisecond)))
			unblock := tc.block(t, b.Ctx, b, pool)
			defer unblock()

			// Both watched at once, each by a control timer of its own from now: watched one
			// after the other, a stall that short's measurement excuses could start long's
			// after its window had ended, with nothing to measure the delay by.
			var longLate, longSched time.Duration
			longDone := make(chan struct{})
			go func() {
				defer close(longDone)
				longLate, longSched = doneLateness(t, long, 10*time.Second)
			}()
			shortLate, shortSched := doneLateness(t, short, 5*time.Second)
			<-longDone
			require.Less(t, shortLate, maxDoneLateness, "short's Done closed %v after its trust window, beyond a scheduler's delay of %v", shortLate, shortSched)
			require.ErrorIs(t, short.Err(), fencelock.ErrTrustWindowExpired)
			require.Less(t, longLate, maxDoneLateness, "long's Done closed %v after its trust window, beyond a scheduler's delay of %v", longLate, longSched)
			t.Logf("Done lateness while renewals are blocked, beyond the scheduler's delay: short %v (delay %v), long %v (delay %v)", shortLate, shortSched, longLate, longSched)
		})
	}
}

// Renewal costs O(n) in the batch: no plan node of the renewal statement does more than a few
// rows' work per lease renewed (rows x loops), including when some leases are not renewed
// (row locked by a guard) and the statement reports the rest. The anti-join it used before
// ran a CTE scan once per lease: about n^2/2 rows (2 million at n = 2,000; 10 s at 16,000).
func TestRenewalPlanLinear(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 2000
	names, tokens, ttls := seedLeases(t, b, n, n)
	// One lease's row is locked by a guard-like transaction: the statement then reports the
	// current leases too.
	guard, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = guard.Rollback(b.Ctx) }()
	_, err = guard.Exec(b.Ctx, `SELECT 1 FROM fencelock.leases WHERE name = 'lease:1' FOR SHARE`)
	require.NoError(t, err)

	var plan []map[string]any
	// sqlc numbers the parameters in order of appearance: names, tokens, ttls_us, holder.
	err = b.Pool.QueryRow(b.Ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+db.Statement("LeaseRenew"), names, tokens, ttls, "h").Scan(&plan)
	require.NoError(t, err)
	require.Len(t, plan, 1)
	worst, where := testkit.BusiestPlanNode(plan)
	require.LessOrEqual(t, worst, 3.0*n, "plan node %s handles %.0f rows for %d leases: not linear\n%s", where, worst, n, mustJSON(plan))
	t.Logf("renewal of %d leases: the busiest plan node (%s) handles %.0f rows", n, where, worst)
}

func mustJSON(v any) string {
	out, _ := json.MarshalIndent(v, "", " ")
	return string(out)
}

// A token sequence that cannot keep tokens in grant order (CACHE > 1: each backend hands out its
// own block; CYCLE: it wraps; a negative INCREMENT: it counts down) is refused with
// ErrTokenSequence before any token is issued, on every path, and nothing is left held.
func TestTokenSequenceMisconfiguredRefused(t *testing.T) {
	t.Parallel()
	for _, alter := range []string{"CACHE 20", "CYCLE", "INCREMENT -1"} {
		t.Run(alter, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := b.Pool.Exec(b.Ctx, `ALTER SEQUENCE fencelock.leases_token_seq `+alter)
			require.NoError(t, err)
			l := newLessor(t, b.Pool, "a")
			_, err = l.TryAcquire(b.Ctx, "job", time.Minute)
			require.ErrorIs(t, err, fencelock.ErrTokenSequence)
			err = l.TryRunLocked(b.Ctx, "job", func(context.Context, pgx.Tx, fencelock.Token) error { return nil })
			require.ErrorIs(t, err, fencelock.ErrTokenSequence)
			a, err := fencelock.NewAdvisoryLocker(b.Pool, fencelock.WithFencingTokens())
			require.NoError(t, err)
			err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
				_, err := a.TryLockTx(b.Ctx, tx, "job")
				return err
			})
			require.ErrorIs(t, err, fencelock.ErrTokenSequence)
			// The session lock's statement fails after the lock was granted: its connection is
			// closed, never pooled, and the server ends the session, and the lock, when it sees
			// the close.
			_, err = a.TryLock(b.Ctx, "job")
			require.ErrorIs(t, err, fencelock.ErrTokenSequence)
			var leases int // RunLocked leaves an expired placeholder row, with token 0
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.leases WHERE token <> 0 OR expires_at > now()`).Scan(&leases))
			require.Zero(t, leases, "a refused grant left a lease row")

			// Nothing is left held: with the sequence repaired, every path grants (the advisory
			// lock once the closed session's backend has exited: waited for in the server's
			// lock queue, within 5 s).
			var lastValue int64
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT last_value FROM fencelock.leases_token_seq`).Scan(&lastValue))
			require.EqualValues(t, 1, lastValue, "a token was drawn from the misconfigured sequence")
			_, err = b.Pool.Exec(b.Ctx, `ALTER SEQUENCE fencelock.leases_token_seq CACHE 1 INCREMENT 1 NO CYCLE`)
			require.NoError(t, err)
			lctx, cancel := context.WithTimeout(b.Ctx, 5*time.Second)
			defer cancel()
			lk, err := a.Lock(lctx, "job")
			require.NoError(t, err)
			require.Positive(t, lk.Token())
			require.NoError(t, lk.Unlock(b.Ctx))
			lease, err := l.TryAcquire(b.Ctx, "job", time.Minute)
			require.NoError(t, err)
			require.NoError(t, lease.Release(b.Ctx))
		})
	}
}

// A release that fails on the server still stops the heartbeat: the lease then expires within
// its TTL. Judged by events, not by a window the machine must beat: the lessor's renewal
// statements are traced on its pool. A renewal batch formed before the release ended the lease
// may still be sent, and land, after Release returns (seen in CI under load: the expiry moved
// 28 ms, and on a busier machine past 200 ms, after the release returned); at most that one,
// since a lease is in one batch at a time and an ended lease is never queued again. Once it
// has ended, no renewal may start, and the expiry must not move.
func TestFailedReleaseStopsRenewals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := tracedPool(t, b)
	const heartbeat = 20 * time.Millisecond
	l := newLessor(t, pool, "h", fencelock.WithHeartbeatInterval(heartbeat))
	lease, err := l.Acquire(b.Ctx, "job", 600*time.Millisecond)
	require.NoError(t, err)
	// The release fails on the server: a trigger refuses to end h's lease (renewals, which move
	// the expiry ahead, still pass). (An ended ctx no longer makes it fail: Release detaches.)
	_, err = b.Pool.Exec(b.Ctx, `CREATE FUNCTION refuse_release() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.expires_at <= clock_timestamp() THEN RAISE EXCEPTION 'release refused by the test'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_release BEFORE UPDATE ON fencelock.leases FOR EACH ROW
			WHEN (NEW.holder = 'h') EXECUTE FUNCTION refuse_release()`)
	require.NoError(t, err)
	testkit.WaitFor(t, b.Ctx, "a renewal of the lease", func() bool { return tr.count("LeaseRenew") > 0 })
	require.ErrorContains(t, lease.Release(b.Ctx), "release refused by the test")
	released := time.Now()
	require.ErrorIs(t, lease.Err(), fencelock.ErrReleased)
	testkit.WaitFor(t, b.Ctx, "the renewal in flight, if any, to end", func() bool { return tr.inFlight("LeaseRenew") == 0 })
	before := readExpiry(t, b, "job")
	afterRelease := tr.startedAfter("LeaseRenew", released)
	require.LessOrEqual(t, afterRelease, 1, "renewals started after the release returned: only a batch formed before it may")
	settled := time.Now()
	time.Sleep(5 * heartbeat) // five heartbeats: waiting for renewals that must not come
	require.Zero(t, tr.startedAfter("LeaseRenew", settled), "the heartbeat renewed a released lease")
	require.Equal(t, before, readExpiry(t, b, "job"), "the expiry of a released lease moved")
	_, err = b.Pool.Exec(b.Ctx, `SELECT pg_sleep_until($1::timestamptz + interval '10 milliseconds')`, before)
	require.NoError(t, err)
	other, err := newLessor(t, b.Pool, "other").TryAcquire(b.Ctx, "job", time.Second)
	require.NoError(t, err, "the lease did not expire within its TTL")
	require.NoError(t, other.Release(b.Ctx))
}

func readExpiry(t *testing.T, b *bundle, name string) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT expires_at FROM fencelock.leases WHERE name = $1`, name).Scan(&at))
	return at
}

// Acquire's wait is capped by the holder's remaining TTL on the database clock (plus a quarter
// of the first backoff, as jitter): with a backoff of 12 s to 30 s (equal jitter: the first
// wait is 6 to 12 s), a lease that expires 300 ms after the waiter starts is granted at most
// 0.3 + 3 s after, not after a backoff period (6 s or more). The gap between the two is wide
// enough for a loaded machine (a backoff of 4 s left 0.7 s).
func TestAcquireWaitCappedByRemainingTTL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := newLessor(t, b.Pool, "holder", fencelock.WithoutHeartbeat()).Acquire(b.Ctx, "job", 300*time.Millisecond)
	require.NoError(t, err)
	slow := newLessor(t, b.Pool, "slow", fencelock.WithBackoff(fencelock.ExponentialBackoff(12*time.Second, 30*time.Second)))
	start := time.Now()
	lease, err := slow.Acquire(b.Ctx, "job", time.Second)
	require.NoError(t, err)
	waited := time.Since(start)
	require.Less(t, waited, 5*time.Second, "Acquire slept its backoff instead of the holder's remaining TTL")
	require.Greater(t, lease.Token(), holder.Token())
	require.NoError(t, lease.Release(b.Ctx))
	t.Logf("granted %v after the waiter started (holder's TTL 300 ms, backoff from 12 s)", waited.Round(time.Millisecond))
}
