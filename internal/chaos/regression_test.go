package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Regression test for a bug found by TestScenarioSIGSTOP, fixed in lease.go: Lease.Err
// returned nil, and Done stayed open, after the trust window had ended, until the heartbeat
// goroutine's timer happened to run. A holder that checked Err() right after a pause (a
// resumed SIGSTOP, a long GC) was told the lease was still held, ~0.3-1.2 s past the
// server-side expiry in almost every run. Lease.Err now reads the clock and ends the lease
// on the spot.
//
// Here nothing renews the lease (no heartbeat), and a tight loop looks for a moment past
// TrustedUntil at which Err still returns nil.
func TestRegressionErrNilPastTrustWindow(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{timeout: time.Minute})
	ctx, db := e.ctx, e.db
	// No heartbeat: nothing renews the lease, as when every renewal fails.
	l, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("h"), fencelock.WithoutHeartbeat())
	require.NoError(t, err)
	// TTL 1 s: with 300 ms, a loaded machine's reply came after the trust window (270 ms), and
	// the try was refused before the loop below could look at anything.
	lease, err := l.TryAcquire(ctx, "trust", time.Second)
	require.NoError(t, err)
	var trustedLate time.Duration
	for ctx.Err() == nil {
		now := time.Now()
		if lease.Err() != nil {
			break
		}
		if late := now.Sub(lease.TrustedUntil()); late > 0 {
			trustedLate = late
			break
		}
	}
	require.Zero(t, trustedLate, "Err() returned nil %v after the trust window ended", trustedLate)
}

// Regression test for a bug found by scenario 3 (TestScenarioProxyLatencyBlackhole/blackhole),
// fixed in lease.go: Release removed the lease from the heartbeat, ran its statement, and
// closed Done only when the statement returned. While that statement hung (a blackholed
// connection) no one closed Done at the end of the trust window: a goroutine watching Done
// kept trusting the lease past the server-side expiry while a contender already held it.
// Release now closes Done before it sends the statement.
//
// Done must be seen closed while the statement hangs: before Release returns, and before the
// statement's own bound (hungStatementBound) has passed since Release began, which is when,
// before the fix, the statement returned and Done closed. The TTL (10 s, trust window 9 s)
// outlasts that bound, so the trust window's end closes nothing meanwhile.
func TestRegressionDoneOpenDuringHungRelease(t *testing.T) {
	t.Parallel()
	ctx, hpool, blackhole := blackholedPool(t)
	l, err := fencelock.NewLessor(hpool, fencelock.WithHolder("h"))
	require.NoError(t, err)
	lease, err := l.TryAcquire(ctx, "hung-release", 10*time.Second)
	require.NoError(t, err)
	closedAfter, endReturned := doneWhileHung(t, ctx, blackhole, lease.Done(), lease.Release)
	require.False(t, endReturned, "Release returned before Done was seen closed (%v after Release began; -1: not closed)", closedAfter)
	require.Less(t, closedAfter, hungStatementBound, "Done closed %v after Release began, not while its statement hung", closedAfter)
	require.ErrorIs(t, lease.Err(), fencelock.ErrReleased)
}

// Regression test for the advisory twin of the hung-Release bug, found by reading: Unlock
// closed Done only after its statement returned, so while the statement hung on a blackholed
// connection a goroutine watching Done kept trusting a lock its holder was giving up (and the
// watchdog skips a lock whose connection Unlock has taken). Unlock now closes Done first. As
// for Release, Done must be seen closed before Unlock returns and before its statement's bound
// has passed.
func TestRegressionDoneOpenDuringHungUnlock(t *testing.T) {
	t.Parallel()
	ctx, hpool, blackhole := blackholedPool(t)
	a, err := fencelock.NewAdvisoryLocker(hpool)
	require.NoError(t, err)
	lk, err := a.TryLock(ctx, "hung-unlock")
	require.NoError(t, err)
	closedAfter, endReturned := doneWhileHung(t, ctx, blackhole, lk.Done(), lk.Unlock)
	require.False(t, endReturned, "Unlock returned before Done was seen closed (%v after Unlock began; -1: not closed)", closedAfter)
	require.Less(t, closedAfter, hungStatementBound, "Done closed %v after Unlock began, not while its statement hung", closedAfter)
	require.ErrorIs(t, lk.Err(), fencelock.ErrUnlocked)
}

// hungStatementBound is how long Release's and Unlock's statement may hang: they bound it by
// 5 s of their own (fencelock's cleanupTimeout, whatever their ctx), and it returns then on a
// blackholed connection. A Done that closes only when the statement returns closes no sooner.
const hungStatementBound = 5 * time.Second

// blackholedPool returns a context for the test, a pool whose connections go through
// toxiproxy, and a function that blackholes them both ways (bytes dropped, nothing closed)
// and returns the function that lifts the blackhole.
func blackholedPool(t *testing.T) (context.Context, *pgxpool.Pool, func() (lift func())) {
	t.Helper()
	e := setup(t, setupOpts{timeout: time.Minute, proxy: true})
	return e.ctx, e.hpool, func() func() {
		require.NoError(t, e.tp.add("bh-up", "timeout", "upstream", map[string]int64{"timeout": 0}))
		require.NoError(t, e.tp.add("bh-down", "timeout", "downstream", map[string]int64{"timeout": 0}))
		return func() { require.NoError(t, e.tp.reset()) }
	}
}

// doneWhileHung blackholes the connection, calls end (a Release or an Unlock, whose statement
// then hangs until the blackhole lifts or its own bound, hungStatementBound, passes) in a
// goroutine, and waits for done to close or end to return, whichever it sees first. It returns
// how long after end began it saw done closed (-1: end returned first) and whether end had
// returned by then. It lifts the blackhole and waits for end to return before it returns.
func doneWhileHung(t *testing.T, ctx context.Context, blackhole func() func(), done <-chan struct{}, end func(context.Context) error) (closedAfter time.Duration, endReturned bool) {
	t.Helper()
	lift := blackhole()
	ended := make(chan error, 1)
	start := time.Now()
	go func() { ended <- end(ctx) }()
	select {
	case <-done:
		closedAfter = time.Since(start)
		select {
		case <-ended:
			endReturned = true
		default:
		}
	case <-ended:
		closedAfter, endReturned = -1, true
	}
	lift()
	if !endReturned {
		<-ended
	}
	return closedAfter, endReturned
}
