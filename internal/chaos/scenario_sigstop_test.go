package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Scenario 1: a holder process paused with SIGSTOP past its TTL, then resumed. Two in-process
// workers take the lease over and write; the resumed child keeps writing with its old token
// (a write in flight) and every such write must be rejected by the fence.
// TestStoppedProcessIsFenced below pins the timing down and asserts each step of one such run.
func TestScenarioSIGSTOP(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "1-sigstop-holder"})
	stale, resumeDetect := sigstopRuns(t, e, 3, "sigstop", false)
	// Detection here: from SIGCONT to the resumed holder's Done closing (it slept through
	// the whole trust window).
	e.report.AddDetect(resumeDetect...)
	t.Logf("chaos: scenario=1-sigstop-holder stale_rejected=%d", stale)
	require.Positive(t, stale, "the resumed child's writes must have been rejected as stale")
	logReport(t, e.report)
}

// sigstopRuns makes n runs of scenario 1 (election false) or 12 (true, every holder a
// candidate of an election of the name), each on a name of its own (prefix:run): a holder child
// (TTL 1 s, writing every 20 ms) stopped with SIGSTOP for TTL + U(100 ms, 1 s), and at least
// until one of two in-process workers has taken the lease (the term) over, then resumed; once
// a worker has written (the fence's high-water mark above the child's token), the child is
// told to write once more before it stops. It checks each run's history and returns how many
// of the child's writes were rejected as stale (at least one a run, unless the fence let an
// old token through), and, for each run, the time from SIGCONT to the child's Done closing.
func sigstopRuns(t *testing.T, e *env, n int, prefix string, election bool) (stale int, resumeDetect []time.Duration) {
	t.Helper()
	ctx, db := e.ctx, e.db
	const ttl = time.Second
	for run := range runs(n) {
		name := fmt.Sprintf("%s:%d", prefix, run)
		rec := newRun(t, ctx, db.Pool, name)
		c := startChild(t, childConfig{URL: db.URL, Worker: "child", Name: name, TTL: ttl, Interval: 20 * time.Millisecond, Election: election}, rec)
		grant := c.waitGrant(ctx)

		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range 2 {
			w := &leaseWorker{rec: rec, pool: db.Pool, worker: fmt.Sprintf("w%d", i), name: name, ttl: ttl, writes: 3, gap: 10 * time.Millisecond, election: election,
				opts: []fencelock.LessorOption{backoffUpTo(50 * time.Millisecond)}}
			wg.Go(func() { w.run(wctx) })
		}
		time.Sleep(jitter(0, 300*time.Millisecond))
		stopped := rec.Now()
		c.signal(syscall.SIGSTOP)
		// The pause lasts TTL + U(100 ms, 1 s), and until a worker has taken the lease (the
		// term) over, with a newer token, which a loaded machine may delay past any fixed
		// pause. Not until a worker has written too: the child may be stopped inside its fenced
		// write's transaction, and then no newer write commits before it resumes. A bound for
		// hangs: a takeover that never comes fails the test here.
		minPause := time.After(ttl + jitter(100*time.Millisecond, ttl))
		require.NoError(t, awaitTokenAbove(ctx, db.Pool, `SELECT coalesce((SELECT token FROM fencelock.leases WHERE name = $1), 0)`, name, grant.Token, time.Minute),
			"the lease was not taken over while the child was stopped")
		<-minPause
		c.signal(syscall.SIGCONT)
		resumed := rec.Now()
		rec.Record(Op{Worker: "child", Kind: KindFault, Value: "sigstop", Invoke: stopped, Return: resumed})
		// Once a worker's write has raised the fence past the child's token (a bound for
		// hangs), the child's writes with its old token are stale: its ticks meanwhile, and
		// one more told on stdin, which it makes before it reads the end of its input.
		require.NoError(t, awaitTokenAbove(ctx, db.Pool, `SELECT coalesce((SELECT token FROM fencelock.fences WHERE resource = $1), 0)`, name, grant.Token, time.Minute),
			"no worker wrote with a newer token")
		time.Sleep(jitter(200*time.Millisecond, 500*time.Millisecond))
		c.write()
		c.finish(10 * time.Second)
		stop()
		wg.Wait()

		h := finalCheck(t, ctx, db.Pool, rec, e.report, name)
		stale += staleCount(h, "child")
		for _, op := range h {
			if op.Kind == KindDone && op.Worker == "child" && op.Invoke >= resumed {
				resumeDetect = append(resumeDetect, op.Return-resumed)
			}
		}
	}
	return stale, resumeDetect
}

// A holder process really paused with SIGSTOP past its TTL, step by step (scenario 1 with its
// timing pinned down, so that each step can be asserted): while the child is stopped, a new
// holder takes the lease over with a larger token and writes; resumed and told to write, the
// child finds its lease lost (its own check fails, Done closed with a lost-lease error) and
// its fenced write rejected as stale with current = the new token; the ledger holds the new
// holder's write only.
func TestStoppedProcessIsFenced(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "1-sigstop-stepwise"})
	ctx, db := e.ctx, e.db
	const name = "payment:7"
	rec := newRun(t, ctx, db.Pool, name)
	// Interval 0: the child holds the lease, heartbeat running, and writes only when told.
	c := startChild(t, childConfig{URL: db.URL, Worker: "old", Name: name, TTL: 500 * time.Millisecond}, rec)
	old := c.waitGrant(ctx)

	stopped := rec.Now()
	c.signal(syscall.SIGSTOP)
	cur, err := fencelock.NewLessor(db.Pool, fencelock.WithHolder("new"), backoffUpTo(20*time.Millisecond))
	require.NoError(t, err)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Granted once the TTL ran out on the server, which it cannot while the child's
	// heartbeat runs: the grant shows the child stopped past its TTL.
	ln, ok := acquireRecorded(actx, rec, cur, "new", name, 10*time.Second)
	require.True(t, ok, "not granted: was the child's heartbeat still renewing its lease?")
	require.Greater(t, int64(ln.Token()), old.Token)
	require.NoError(t, (&Appender{Pool: db.Pool, Rec: rec, Worker: "new", Holder: "new"}).Append(ctx, name, ln.Token()))
	c.signal(syscall.SIGCONT)
	rec.Record(Op{Worker: "old", Kind: KindFault, Value: "sigstop", Invoke: stopped, Return: rec.Now()})

	c.write()
	require.NoError(t, c.finish(10*time.Second))
	releaseRecorded(rec, "new", ln)
	h := finalCheck(t, ctx, db.Pool, rec, e.report, name)

	// The child's check, append and Done closing, each exactly once with Interval 0.
	byKind := map[Kind][]Op{}
	for _, op := range h {
		if op.Worker == "old" {
			byKind[op.Kind] = append(byKind[op.Kind], op)
		}
	}
	require.Len(t, byKind[KindCheck], 1)
	require.Equal(t, Fail, byKind[KindCheck][0].Outcome, "the resumed child's own check found the lease held")
	require.Len(t, byKind[KindDone], 1)
	// The error of this grant's loss, whatever its cause (the trust window's end, or the
	// server's verdict if a renewal got there first), as the child recorded it: a string.
	lost := &fencelock.LeaseLostError{Name: name, Token: tok(old.Token), Cause: errors.New("")}
	require.True(t, strings.HasPrefix(byKind[KindDone][0].Err, lost.Error()), "Done closed with %q, not a lost lease", byKind[KindDone][0].Err)
	require.Len(t, byKind[KindAppend], 1)
	write := byKind[KindAppend][0]
	require.True(t, write.Stale && write.Outcome == Fail, "the resumed child's write: %v", write)
	require.Equal(t, int64(ln.Token()), write.Current)
	var written []int64
	for _, entry := range FinalLedgers(h)[name] {
		written = append(written, EntryToken(entry))
	}
	require.Equal(t, []int64{int64(ln.Token())}, written)
	logReport(t, e.report)
}

// awaitTokenAbove polls query (one bigint column, the argument $1 = name) every 5 ms until it
// returns more than token, for at most limit (or until ctx ends).
func awaitTokenAbove(ctx context.Context, pool *pgxpool.Pool, query, name string, token int64, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		var got int64
		err := pool.QueryRow(ctx, query, name).Scan(&got)
		if err == nil && got > token {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%q at %d, not above %d: %w", name, got, token, errors.Join(ctx.Err(), err))
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
}
