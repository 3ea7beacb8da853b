package integration

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// Advisory locks with negative keys: the view reads them back (a pair with a negative key once
// made it fail for the whole database), and release takes a negative key as an argument.
// release --advisory finds holders by key, never by name: a lock of the same name in another
// namespace is left alone.
func TestCLIAdvisoryKeysAndNamespaces(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The locks hold a connection each: on a pool of their own, so that b.Pool stays free.
	holders := newPool(t, b.Ctx, b.DB.URL)
	conn, err := holders.Acquire(b.Ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.Ctx, `SELECT pg_advisory_lock(-1, 5)`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(b.Ctx, `SELECT pg_advisory_unlock_all()`) }()

	a := newLocker(t, holders)
	neg, err := a.TryLock(b.Ctx, "", fencelock.AtKey(fencelock.Int64Key(-5)))
	require.NoError(t, err)
	billing := newLocker(t, holders, fencelock.WithNamespace("billing"))
	reports := newLocker(t, holders, fencelock.WithNamespace("reports"))
	nb, err := billing.TryLock(b.Ctx, "nightly")
	require.NoError(t, err)
	nr, err := reports.TryLock(b.Ctx, "nightly")
	require.NoError(t, err)
	t.Cleanup(func() { // before the pool closes (cleanups run last registered first), on failure too
		for _, lk := range []*fencelock.AdvisoryLock{neg, nb, nr} {
			_ = lk.Unlock(b.Ctx)
		}
	})

	code, out, errOut := cliRun(t, b, "", "locks", "--json")
	require.Equal(t, 0, code, errOut)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	var sawPair, sawNeg bool
	for _, r := range rows {
		sawPair = sawPair || (r["key1"] == float64(-1) && r["key2"] == float64(5))
		sawNeg = sawNeg || r["key"] == float64(-5)
	}
	require.True(t, sawPair, "locks shows the pair (-1, 5): %s", out)
	require.True(t, sawNeg, "locks shows the key -5: %s", out)
	var pair, single int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FILTER (WHERE key1 = -1 AND key2 = 5), count(*) FILTER (WHERE key = -5)
		FROM fencelock.advisory_locks WHERE granted`).Scan(&pair, &single))
	require.Equal(t, 1, pair, "the pair (-1, 5) as taken")
	require.Equal(t, 1, single, "the key -5 as taken")

	code, _, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "--yes", "-5")
	require.Equal(t, 0, code, errOut)
	awaitDone(t, b, neg.Done(), "the lock on key -5")

	code, _, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "--yes", "--namespace", "reports", "nightly")
	require.Equal(t, 0, code, errOut)
	awaitDone(t, b, nr.Done(), "reports' nightly")
	// The command returns once the backends it terminated have exited: billing's is not one.
	require.Equal(t, []uint32{nb.BackendPID()}, advisoryHolders(t, b.Ctx, b.Pool, keyOf(t, billing, "nightly"), true),
		"billing's nightly is still held by its session after a release in namespace reports")
}

// awaitDone waits for done, failing the test when b's context ends first.
func awaitDone(t *testing.T, b *bundle, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-b.Ctx.Done():
		t.Fatalf("%s did not end", what)
	}
}

// force_release decides under the lease row's lock: a grant in flight when it starts (locked,
// not committed) is waited for and then ended, never left holding a lease that a fence raised
// past its token already rejects.
func TestForceReleaseWaitsForGrantInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	var granted int64
	var exp time.Time
	// LeaseGrant's parameters: name, holder, nowait, ttl_us, may_insert.
	require.NoError(t, tx.QueryRow(b.Ctx, db.Statement("LeaseGrant"), "acct", "new", true, time.Minute.Microseconds(), true).Scan(&granted, &exp))

	type result struct {
		oldHolder *string
		oldToken  *int64
		newToken  *int64
		err       error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = b.Pool.QueryRow(b.Ctx, `SELECT old_holder, old_token, new_token FROM fencelock.force_release('acct', ARRAY['acct'])`).
			Scan(&r.oldHolder, &r.oldToken, &r.newToken)
		done <- r
	}()
	waitFor(t, b, "force_release waits for the grant's row lock", func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%force_release%'`).Scan(&n))
		return n == 1
	})
	require.NoError(t, tx.Commit(b.Ctx))
	r := <-done
	require.NoError(t, r.err)
	require.NotNil(t, r.oldHolder, "the grant that committed while force_release waited is the one it ends")
	require.Equal(t, "new", *r.oldHolder)
	require.Equal(t, granted, *r.oldToken)
	require.Greater(t, *r.newToken, granted)
	var held bool
	var fence int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT expires_at > clock_timestamp(), (SELECT token FROM fencelock.fences WHERE resource = 'acct')
		FROM fencelock.leases WHERE name = 'acct'`).Scan(&held, &fence))
	require.False(t, held, "the grant was ended")
	require.Equal(t, *r.newToken, fence)
}

// A release --force that waited for a guarded transaction hands the lease over with a full
// TTL from the moment of the hand-off, not from the start of its own transaction; and --token
// releases only the grant it names.
func TestCLIReleaseForceAfterWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := newLessor(t, b.Pool, "holder")
	waiter := newLessor(t, b.Pool, "waiter")
	lease, err := holder.Acquire(b.Ctx, "job", time.Minute)
	require.NoError(t, err)

	code, _, errOut := cliRun(t, b, "", "release", "--force", "--token", strconv.FormatInt(int64(lease.Token())+1, 10), "job")
	require.Equal(t, 3, code, "a --token that is not the current grant's: %s", errOut)
	require.Contains(t, errOut, "nothing changed")
	require.NoError(t, lease.Renew(b.Ctx), "the lease is still held")

	got := make(chan *fencelock.Lease, 1)
	const waiterTTL = time.Second
	go func() {
		l, err := waiter.Acquire(b.Ctx, "job", waiterTTL)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	awaitWaiters(t, b, "job", 1)

	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	require.NoError(t, lease.GuardTx(b.Ctx, tx))
	type res struct {
		code      int
		out, errS string
	}
	released := make(chan res, 1)
	go func() {
		c, o, e := cliRun(t, b, "", "release", "--force", "--json", "--lock-timeout", "30s", "--token", strconv.FormatInt(int64(lease.Token()), 10), "job")
		released <- res{c, o, e}
	}()
	waitFor(t, b, "release waits for the guarded transaction", func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%force_release%'`).Scan(&n))
		return n == 1
	})
	time.Sleep(waiterTTL + 200*time.Millisecond) // the wait itself is what is measured: longer than the waiter's TTL
	require.NoError(t, tx.Commit(b.Ctx))
	r := <-released
	require.Equal(t, 0, r.code, r.errS)
	var out struct {
		NewToken *int64  `json:"new_token"`
		HandedTo *string `json:"handed_to"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &out), r.out)
	require.NotNil(t, out.HandedTo, r.out)
	require.Equal(t, "waiter", *out.HandedTo)
	l := <-got
	require.NotNil(t, l)
	require.EqualValues(t, *out.NewToken, l.Token(), "the waiter holds the grant the release handed over, not a later one")
	require.NoError(t, l.Release(b.Ctx))
	require.True(t, strings.HasPrefix(r.out, "{"))
}

// A zombie whose grant T lapsed on the server before anyone took the lease over: release
// --force --token T fences T out (the grant the operator saw is the last one, lapsed or not).
func TestCLIReleaseLapsedGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lease := lapsedGrant(t, b, "acct")

	code, out, errOut := cliRun(t, b, "", "release", "--force", "--json", "--token", strconv.FormatInt(int64(lease.Token()), 10), "acct")
	require.Equal(t, 0, code, errOut)
	requireLapseFenced(t, out, lease)
	err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, "acct", lease.Token()) })
	require.ErrorIs(t, err, fencelock.ErrStaleToken, "the lapsed zombie's token is fenced out")

	code, _, errOut = cliRun(t, b, "", "release", "--force", "--token", "0", "acct")
	require.Equal(t, 2, code, "--token 0 is no token: %s", errOut)
}

// A holder that fences (locking a fence row) before it guards (the lease row) deadlocks with a
// concurrent release --force, which holds the lease row and then raises the fence: PostgreSQL
// breaks the cycle, and the release exits 4 (retry), not 1.
//
// Which session PostgreSQL makes the victim depends on whose deadlock_timeout fires after the
// cycle has formed (each waiter checks once): the release's sessions get 5 s (a database
// setting), the holder's transaction 60 s, so the release is the one that finds the cycle even
// when the machine is slow to let the holder start waiting (a loaded CI run made the holder
// the victim when both had 1 s).
func TestCLIReleaseDeadlockWithHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `ALTER DATABASE `+pgx.Identifier{b.DB.Name}.Sanitize()+` SET deadlock_timeout = '5s'`)
	require.NoError(t, err)
	holder := newLessor(t, b.Pool, "holder")
	lease, err := holder.TryAcquire(b.Ctx, "acct", time.Minute)
	require.NoError(t, err)
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }()
	_, err = tx.Exec(b.Ctx, `SET LOCAL deadlock_timeout = '60s'`)
	require.NoError(t, err)
	require.NoError(t, fencelock.FenceTx(b.Ctx, tx, "acct", lease.Token())) // the fence row first

	type res struct {
		code   int
		stderr string
	}
	released := make(chan res, 1)
	go func() {
		c, _, e := cliRun(t, b, "", "release", "--force", "--lock-timeout", "30s", "acct")
		released <- res{c, e}
	}()
	waitFor(t, b, "release waits for the fence row", func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%force_release%'`).Scan(&n))
		return n == 1
	})
	guardErr := lease.GuardTx(b.Ctx, tx) // then the lease row: a cycle
	r := <-released
	require.Equal(t, 4, r.code, r.stderr)
	require.Contains(t, r.stderr, "deadlock")
	if guardErr == nil {
		require.NoError(t, tx.Commit(b.Ctx))
	}
}

// A live holder whose lease is force-released learns it at its next renewal: its Done closes
// within a heartbeat interval (here 500 ms, TTL 3 s) plus the renewal's statement, with a
// LeaseLostError, long before its TTL would have ended. (Its fenced writes are rejected from the
// release on: TestCLIReleaseForce.)
func TestCLIReleaseForceSignalsHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const heartbeat = 500 * time.Millisecond
	holder := newLessor(t, b.Pool, "live", fencelock.WithHeartbeatInterval(heartbeat))
	lease, err := holder.TryAcquire(b.Ctx, "acct", 3*time.Second)
	require.NoError(t, err)
	code, _, errOut := cliRun(t, b, "", "release", "--force", "acct")
	require.Equal(t, 0, code, errOut)
	released := time.Now()
	select {
	case <-lease.Done():
	case <-time.After(heartbeat + 2*time.Second):
		t.Fatal("the holder was not told its lease was released by force")
	}
	require.ErrorIs(t, lease.Err(), fencelock.ErrLeaseLost)
	t.Logf("Done closed %v after the forced release (heartbeat %v)", time.Since(released).Round(time.Millisecond), heartbeat)
}

// Issue 39, item 5: release --force of a semaphore's permit ("S#i") goes to the head of the
// semaphore's queue as its holder's release does, and says so. Before migration 00018 it went
// through the lease queue of "S#0", which is empty: the command answered handed_to null, and
// the head waited for its own next look (627-917 ms measured; a refresh every 1.67 s here,
// with a 10 s TTL). The head is given the permit with the release's new token, or, when its
// own attempt is running at that instant, the permit is freed and the head is told to take it
// ("woken"): an attempt that meets the second, rarer case says so and runs again, since only
// the first proves by its token that the release, not the head's own look, granted it.
func TestCLIReleaseForcePermitGoesToHead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := newLessor(t, b.Pool, "holder")
	waiter := newLessor(t, b.Pool, "waiter")
	for attempt := 1; ; attempt++ {
		sem := "api-" + strconv.Itoa(attempt)
		hs, err := fencelock.NewSemaphore(holder, sem, 1)
		require.NoError(t, err)
		ws, err := fencelock.NewSemaphore(waiter, sem, 1)
		require.NoError(t, err)
		permit, err := hs.TryAcquire(b.Ctx, time.Minute)
		require.NoError(t, err)
		got := fencetest.PermitAsync(b.Ctx, ws, 10*time.Second)
		testkit.AwaitPermitWaiters(t, b.Ctx, b.Pool, sem, "waiter")
		code, out, errOut := cliRun(t, b, "", "release", "--force", "--json", sem+"#0")
		require.Equal(t, 0, code, errOut)
		var res struct {
			NewToken *int64  `json:"new_token"`
			HandedTo *string `json:"handed_to"`
			Woken    *string `json:"woken"`
			Waiting  int64   `json:"waiting"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		require.NotNil(t, res.NewToken, out)
		require.Greater(t, *res.NewToken, int64(permit.Token()), out)
		g := fencetest.Receive(t, got, 10*time.Second)
		require.NoError(t, g.Err)
		l := g.Lease
		require.Greater(t, int64(l.Token()), int64(permit.Token()))
		require.NoError(t, l.Release(b.Ctx))
		if res.HandedTo == nil {
			require.NotNil(t, res.Woken, "a forced release of a permit its semaphore's head waits for gave it to nobody and woke nobody: %s", out)
			require.Equal(t, "waiter", *res.Woken, out)
			require.Less(t, attempt, 5, "the head's own attempt was running at each of 5 forced releases")
			t.Logf("attempt %d: the permit was freed and the head woken (its attempt was running); again", attempt)
			continue
		}
		require.Equal(t, "waiter", *res.HandedTo, out)
		require.Nil(t, res.Woken, out)
		require.EqualValues(t, *res.NewToken, l.Token(), "the waiter holds the permit the release gave it, not one it took later")
		require.Zero(t, res.Waiting, out)

		// The text output, on a second round: handed to the waiter.
		permit, err = hs.TryAcquire(b.Ctx, time.Minute)
		require.NoError(t, err)
		got = fencetest.PermitAsync(b.Ctx, ws, 10*time.Second)
		testkit.AwaitPermitWaiters(t, b.Ctx, b.Pool, sem, "waiter")
		code, out, errOut = cliRun(t, b, "", "release", "--force", sem+"#0")
		require.Equal(t, 0, code, errOut)
		require.Regexp(t, `held by holder \(token \d+\); fenced with token \d+ \(`+sem+`#0\); (handed to waiter|freed; woke the head of the queue, waiter, to take it)\n$`, out)
		g = fencetest.Receive(t, got, 10*time.Second)
		require.NoError(t, g.Err)
		require.Greater(t, int64(g.Lease.Token()), int64(permit.Token()))
		require.NoError(t, g.Lease.Release(b.Ctx))
		return
	}
}
