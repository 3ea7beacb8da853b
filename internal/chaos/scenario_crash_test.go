package chaos

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// Scenario 6: the server crashes (immediate shutdown: no checkpoint) under lease holders and
// writers, right after a burst of acknowledged grants, and restarts after a random outage,
// with the server default synchronous_commit on and off (checked: the subtest means nothing
// if "off" is not the default). Tokens must keep rising across every crash: a grant after the
// restart carries a larger token than every grant acknowledged before it, over all the runs'
// crashes, and no grant shares a token. No acknowledged write may be lost, and a holder whose
// trust window ended during the outage must see Done close before the server-side expiry.
func TestScenarioServerCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc       string
		settings   []pgtest.Option
		syncCommit string // the server default of synchronous_commit that settings make
	}{
		{"default", nil, "on"},
		{"sync-commit-off", []pgtest.Option{pgtest.AsyncCommit()}, "off"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			e := setup(t, setupOpts{scenario: "6-server-crash-" + tc.desc, server: append(tc.settings, pgtest.Crashable())})
			ctx, db, srv, report := e.ctx, e.db, e.db.Server, e.report
			const ttl = 800 * time.Millisecond
			// The held grants' own pool, reset after each restart (as the crashed server's
			// clients would be) so that the grant after it and its release do not pick a
			// connection the crash broke; the workers' pool is left to find those itself.
			hpool, err := pgxpool.New(ctx, db.URL)
			require.NoError(t, err)
			t.Cleanup(hpool.Close)
			held, err := fencelock.NewLessor(hpool, fencelock.WithHolder("held"))
			require.NoError(t, err)
			var top int64 // the largest token granted in the runs before this one
			for run := range runs(3) {
				name := fmt.Sprintf("crash:%d", run)
				rec := newRun(t, ctx, db.Pool, name)
				wctx, stop := context.WithCancel(ctx)
				var wg sync.WaitGroup
				for i := range 3 {
					w := &leaseWorker{rec: rec, pool: db.Pool, worker: fmt.Sprintf("w%d", i), name: name, ttl: ttl, writes: 4, gap: 5 * time.Millisecond,
						opts: []fencelock.LessorOption{backoffUpTo(50 * time.Millisecond)}}
					wg.Go(func() { w.run(wctx) })
				}
				time.Sleep(jitter(100*time.Millisecond, 400*time.Millisecond))
				// Many grants, held (no release, whose own commit would flush the WAL), the
				// crash right after the last acknowledged one: with asynchronous commit the
				// tail of the WAL, and the sequence's advance, would be lost.
				for i := range 100 {
					_, ok := acquireRecorded(ctx, rec, held, "held", fmt.Sprintf("held:%d:%d", run, i), time.Minute)
					require.True(t, ok, "held grant %d of run %d", i, run)
				}
				crashed := rec.Now()
				require.NoError(t, srv.Crash(ctx))
				time.Sleep(jitter(0, 2*ttl)) // short outages keep the lease, long ones lose it
				require.NoError(t, srv.Restart(ctx))
				rec.Record(Op{Kind: KindFault, Value: "crash-server", Invoke: crashed, Return: rec.Now()})
				hpool.Reset()
				after := acquireRetrying(t, ctx, rec, held, "held", fmt.Sprintf("after:%d", run), 30*time.Second)
				require.NoError(t, after.Release(ctx))
				time.Sleep(jitter(300*time.Millisecond, 600*time.Millisecond))
				stop()
				wg.Wait()
				h := finalCheck(t, ctx, db.Pool, rec, report, name)
				report.AddDetect(doneDetect(h)...)
				before := max(top, maxGranted(h, crashed))
				require.Greater(t, int64(after.Token()), before, "run %d: a token acknowledged before the crash was issued again", run)
				top = max(before, maxGranted(h, math.MaxInt64)) // every grant of this run precedes the next crash
			}
			var sc string
			require.NoError(t, db.Pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc))
			require.Equal(t, tc.syncCommit, sc)
			t.Logf("chaos: scenario=%s detect=Done closing minus server-side expiry (negative: before it)", report.Scenario)
			logReport(t, report)
		})
	}
}

// acquireRetrying grants name with l as worker for a minute, recording each attempt in rec,
// and retries every 20 ms while the pool reconnects after a fault; it fails the test after
// limit.
func acquireRetrying(t *testing.T, ctx context.Context, rec *Recorder, l *fencelock.Lessor, worker, name string, limit time.Duration) *fencelock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		if lease, ok := acquireRecorded(ctx, rec, l, worker, name, time.Minute); ok {
			return lease
		}
		require.NoError(t, ctx.Err(), "%q not granted within %v", name, limit)
		sleepCtx(ctx, 20*time.Millisecond) // the server is restarting: nothing to await but a connection
	}
}

// maxGranted returns the largest token of the grants in h acknowledged (OK) by at, a local
// time since the recorder started (0 if none).
func maxGranted(h History, at time.Duration) int64 {
	top := int64(0)
	for _, op := range h {
		if op.Kind == KindGrant && op.Outcome == OK && op.Return <= at {
			top = max(top, op.Token)
		}
	}
	return top
}
