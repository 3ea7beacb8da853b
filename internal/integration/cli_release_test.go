package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/cli"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// release --force ends a zombie's grant: the waiter gets the lease with the new token, which
// also fences the other resource; the zombie's fenced writes are then refused. Without --force
// it is refused; with the holder inside a guarded transaction it gives up after --lock-timeout,
// naming the holder's backend (see blockerSampleRoom for the lock timeout it is given).
func TestCLIReleaseForce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	zombie, err := newLessor(t, b.Pool, "zombie", fencelock.WithoutHeartbeat()).TryAcquire(b.Ctx, "cli:job", time.Minute)
	require.NoError(t, err)
	waiting := fencetest.AcquireAsync(b.Ctx, newLessor(t, b.Pool, "waiter"), "cli:job", time.Minute)
	awaitWaiters(t, b, "cli:job", 1)

	// Without --force: a usage error, nothing changes.
	code, _, errOut := cliRun(t, b, "", "release", "cli:job")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "needs --force")
	require.Equal(t, leaseRow{Holder: "zombie", Token: int64(zombie.Token())}, readLease(t, b.Ctx, b.Pool, "cli:job"))

	// The holder inside a guarded transaction: the lease row stays locked until it ends.
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.Ctx) }() // on failure too: the pool closes at cleanup
	require.NoError(t, zombie.GuardTx(b.Ctx, tx))
	guardPID := tx.Conn().PgConn().PID()
	lockTimeout := blockerSampleRoom(t, b)
	start := time.Now()
	code, out, errOut := cliRun(t, b, "", "release", "--force", "--lock-timeout", lockTimeout.String(), "cli:job")
	require.Equal(t, cli.ExitLockTimeout, code, "stdout %q stderr %q", out, errOut)
	require.GreaterOrEqual(t, time.Since(start), lockTimeout)
	require.Regexp(t, `^fencelock: release lease "cli:job": the lease row is locked by another transaction: .*guarded transaction of its holder.*; `+
		fmt.Sprintf(`pg_blocking_pids: pid %d \(`, guardPID)+`.*--lock-timeout `+regexp.QuoteMeta(lockTimeout.String())+`.*raise --lock-timeout\n$`, errOut)
	require.NoError(t, tx.Rollback(b.Ctx))
	require.Equal(t, leaseRow{Holder: "zombie", Token: int64(zombie.Token())}, readLease(t, b.Ctx, b.Pool, "cli:job"))

	// The forced release: handed to the waiter, both resources fenced with its token.
	code, out, errOut = cliRun(t, b, "", "release", "--force", "cli:job", "--fence", "cli:other")
	require.Equal(t, cli.ExitOK, code, errOut)
	m := regexp.MustCompile(`^released lease "cli:job" held by zombie \(token (\d+)\); fenced with token (\d+) \(cli:job, cli:other\); handed to waiter\n$`).
		FindStringSubmatch(out)
	require.NotNil(t, m, out)
	require.Equal(t, strconv.FormatInt(int64(zombie.Token()), 10), m[1])
	got := fencetest.Receive(t, waiting, 10*time.Second)
	require.NoError(t, got.Err)
	defer got.Lease.Release(b.Ctx)
	require.Equal(t, m[2], strconv.FormatInt(int64(got.Lease.Token()), 10))

	// The zombie wakes up: its lease is gone, and its token is stale on the other resource.
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return zombie.FenceTx(b.Ctx, tx, "cli:job") })
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, "cli:other", zombie.Token()) })
	require.ErrorIs(t, err, fencelock.ErrStaleToken)

}

// blockerSampleRoom returns the --lock-timeout TestCLIReleaseForce gives a release that waits
// for a locked lease row, so that the message can name the blocking backend: the command
// learns it from pg_blocking_pids, sampled on a second connection (internal/cli,
// watchBlockers) every eighth of the lock timeout, so a lock timeout shorter than a few of
// those queries on a loaded machine leaves the message without it ("pg_blocking_pids named no
// backend while it waited", as a 200 ms one did, when the command still opened that
// connection once the release had begun). The timeout is derived from this run: twenty times
// the longest of three such queries on an open connection, 1 s at least and 10 s at most (the
// zombie's TTL is a minute).
func blockerSampleRoom(t *testing.T, b *bundle) time.Duration {
	t.Helper()
	conn, err := pgx.Connect(b.Ctx, b.DB.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(b.Ctx) }()
	var longest time.Duration
	for range 3 {
		start := time.Now()
		var n int
		require.NoError(t, conn.QueryRow(b.Ctx, `SELECT count(*) FROM pg_catalog.unnest(pg_catalog.pg_blocking_pids(pg_catalog.pg_backend_pid()))`).Scan(&n))
		longest = max(longest, time.Since(start))
	}
	d := min(10*time.Second, max(time.Second, 20*longest)).Round(time.Millisecond)
	t.Logf("--lock-timeout %v (a query of pg_blocking_pids took %v at most)", d, longest.Round(time.Millisecond))
	return d
}

// releaseJSON is the object release --json prints for a lease, as a script reads it.
type releaseJSON struct {
	Lease     string   `json:"lease"`
	Held      bool     `json:"held"`
	Lapsed    bool     `json:"lapsed"`
	OldHolder *string  `json:"old_holder"`
	OldToken  *int64   `json:"old_token"`
	NewToken  *int64   `json:"new_token"`
	HandedTo  *string  `json:"handed_to"`
	Fenced    []string `json:"fenced"`
}

// lapsedGrant returns a grant of name to holder "zombie" (no heartbeat, TTL 1 s) once it has
// lapsed on the server, nobody having taken the lease over. A grant whose reply came after its
// trust window is refused by TryAcquire (released at once, ErrNotAcquired), as on a loaded
// machine a 300 ms one was; it asks again, 20 times at most.
func lapsedGrant(t *testing.T, b *bundle, name string) *fencelock.Lease {
	t.Helper()
	lessor := newLessor(t, b.Pool, "zombie", fencelock.WithoutHeartbeat())
	var lease *fencelock.Lease
	var err error
	for range 20 {
		// Only a late grant is asked again: it is ErrNotAcquired for errors.Is, and not the
		// sentinel itself, which says someone else holds the name.
		if lease, err = lessor.TryAcquire(b.Ctx, name, time.Second); !errors.Is(err, fencelock.ErrNotAcquired) || err == fencelock.ErrNotAcquired {
			break
		}
		t.Logf("TryAcquire(%q, 1s): %v; again", name, err)
	}
	require.NoError(t, err)
	waitFor(t, b, "the grant lapses on the server", func() bool { return readLease(t, b.Ctx, b.Pool, name).Expired })
	return lease
}

// requireLapseFenced checks out, what release --force --json printed for the lapsed grant
// zombie (lapsedGrant): the lease not held, the grant lapsed, zombie's holder and token as the
// old ones, and a newer token fenced. It returns the report.
func requireLapseFenced(t *testing.T, out string, zombie *fencelock.Lease) releaseJSON {
	t.Helper()
	var res releaseJSON
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.False(t, res.Held)
	require.True(t, res.Lapsed)
	require.Equal(t, "zombie", *res.OldHolder)
	require.EqualValues(t, zombie.Token(), *res.OldToken)
	require.Greater(t, *res.NewToken, int64(zombie.Token()))
	return res
}

// release --force on a lease nobody holds exits 3 (not held), as README and --help say, and
// says whether it raised the fence: a name never granted is left unchanged (no lease row, no
// fence: a mistyped name leaves nothing behind); a grant that lapsed without a successor has
// its holder fenced out all the same; a name released by force before, and not granted since,
// is left as it is.
func TestCLIReleaseForceNotHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	count := func(query, name string) int {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, query, name).Scan(&n))
		return n
	}
	const leaseRows = `SELECT count(*) FROM fencelock.leases WHERE name = $1`
	const fenceRows = `SELECT count(*) FROM fencelock.fences WHERE resource = $1`

	// Never granted: exit 3, nothing changed.
	code, out, errOut := cliRun(t, b, "", "release", "--force", "cli:idle", "--fence", "cli:idle-other")
	require.Equal(t, cli.ExitNotFound, code, "stdout %q stderr %q", out, errOut)
	require.Empty(t, out)
	require.Equal(t, "fencelock: release lease \"cli:idle\": not held: never granted (or not since its last forced release); nothing changed, no fence raised\n", errOut)
	code, out, errOut = cliRun(t, b, "", "release", "--force", "--json", "cli:idle")
	require.Equal(t, cli.ExitNotFound, code, errOut)
	var res releaseJSON
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, releaseJSON{Lease: "cli:idle", Fenced: []string{}}, res)
	require.Zero(t, count(leaseRows, "cli:idle"), "a lease row was left behind")
	require.Zero(t, count(fenceRows, "cli:idle"), "a fence was raised")
	require.Zero(t, count(fenceRows, "cli:idle-other"), "a fence was raised")

	// A lapsed grant, nobody after it: exit 3, and its holder is fenced out.
	zombie := lapsedGrant(t, b, "cli:lapsed")
	code, out, errOut = cliRun(t, b, "", "release", "--force", "--json", "cli:lapsed", "--fence", "cli:lapsed-other")
	require.Equal(t, cli.ExitNotFound, code, errOut)
	res = requireLapseFenced(t, out, zombie)
	require.Nil(t, res.HandedTo)
	require.Equal(t, []string{"cli:lapsed", "cli:lapsed-other"}, res.Fenced)
	require.Equal(t, fmt.Sprintf("fencelock: release lease \"cli:lapsed\": not held: the grant of zombie (token %d) had lapsed; fenced with token %d (cli:lapsed, cli:lapsed-other), so its holder's fenced writes are refused\n",
		zombie.Token(), *res.NewToken), errOut)
	for _, r := range res.Fenced {
		err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, r, zombie.Token()) })
		require.ErrorIs(t, err, fencelock.ErrStaleToken, "the lapsed holder is not fenced out of %q", r)
	}

	// Released by force already, not granted since: exit 3, nothing changed.
	code, _, errOut = cliRun(t, b, "", "release", "--force", "cli:lapsed")
	require.Equal(t, cli.ExitNotFound, code, errOut)
	require.Contains(t, errOut, "nothing changed, no fence raised")
	var fence int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT token FROM fencelock.fences WHERE resource = 'cli:lapsed'`).Scan(&fence))
	require.Equal(t, *res.NewToken, fence, "the fence moved")

	// The lease is granted as usual afterwards, with a token above the fence.
	lease, err := newLessor(t, b.Pool, "next").TryAcquire(b.Ctx, "cli:lapsed", time.Minute)
	require.NoError(t, err)
	require.Greater(t, int64(lease.Token()), fence)
	require.NoError(t, lease.Release(b.Ctx))

	// --help says the same.
	code, out, _ = cliRun(t, b, "", "help", "release")
	require.Equal(t, cli.ExitOK, code)
	require.Contains(t, out, "exit 3 when nobody does")
	require.Contains(t, out, "3  nothing held: release found no holder")
}

// release --force --advisory terminates the backend holding a session advisory lock, after a
// y/N prompt: declined, the lock stays held; with --yes the holder's Done closes and the lock
// is free. By key pair too; nothing held exits 3.
func TestCLIReleaseAdvisory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := fencelock.NewAdvisoryLocker(newPool(t, b.Ctx, b.DB.URL), fencelock.WithWatchdogInterval(time.Second))
	require.NoError(t, err)
	lk, err := holder.TryLock(b.Ctx, "cli-report")
	require.NoError(t, err)
	pid := lk.BackendPID()
	// The label the prompt shows is set by the lock's first watchdog probe (1 s here).
	waitFor(t, b, "the lock's label", func() bool {
		var app string
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&app))
		return app == "fencelock cli-report"
	})
	heldBy := func(pid uint32) int {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.advisory_locks WHERE granted AND pid = $1`, int32(pid)).Scan(&n))
		return n
	}

	code, out, errOut := cliRun(t, b, "n\n", "release", "--force", "--advisory", "cli-report")
	require.Equal(t, cli.ExitError, code, "stdout %q", out)
	require.Contains(t, errOut, fmt.Sprintf("terminate backend %d (fencelock cli-report", pid))
	require.Contains(t, errOut, fmt.Sprintf("fencelock: declined: backend %d not terminated", pid))
	require.Empty(t, out)
	require.Equal(t, 1, heldBy(pid))
	require.NoError(t, lk.Err())

	code, out, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "--yes", "cli-report")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Regexp(t, fmt.Sprintf(`^terminated backend %d \(fencelock cli-report.*\), which held advisory lock "cli-report" \(key -?\d+\)\n$`, pid), out)
	select {
	case <-lk.Done():
		require.ErrorIs(t, lk.Err(), fencelock.ErrLockLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the terminated holder's Done did not close within 5s")
	}
	other, err := fencelock.NewAdvisoryLocker(b.Pool)
	require.NoError(t, err)
	again, err := other.TryLock(b.Ctx, "cli-report")
	require.NoError(t, err)
	require.NoError(t, again.Unlock(b.Ctx))

	// By key pair.
	pair, err := holder.TryLock(b.Ctx, "", fencelock.AtKey(fencelock.Int32PairKey(7, 8)))
	require.NoError(t, err)
	code, out, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "--yes", "--json", "7,8")
	require.Equal(t, cli.ExitOK, code, errOut)
	var res struct {
		Terminated []struct {
			PID int32 `json:"pid"`
		} `json:"terminated"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Len(t, res.Terminated, 1)
	require.Equal(t, int32(pair.BackendPID()), res.Terminated[0].PID)
	select {
	case <-pair.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the terminated holder's Done did not close within 5s")
	}

	code, _, errOut = cliRun(t, b, "", "release", "--force", "--advisory", "cli-report")
	require.Equal(t, cli.ExitNotFound, code)
	require.Regexp(t, `^fencelock: no backend holds advisory lock "cli-report" \(key -?\d+\)\n$`, errOut)
}
