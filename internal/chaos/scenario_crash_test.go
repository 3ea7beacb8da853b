package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// Scenario 6: the server crashes (immediate shutdown: no checkpoint) under lease holders and
// writers, and restarts after a random outage, with the server default synchronous_commit
// on and off. Tokens must keep rising across the crash (no grant shares a token), no
// acknowledged write may be lost, and a holder whose trust window ended during the outage
// must see Done close before the server-side expiry.
func TestScenarioServerCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc     string
		settings []pgtest.Option
	}{
		{"default", nil},
		{"sync-commit-off", []pgtest.Option{pgtest.AsyncCommit()}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			e := setup(t, setupOpts{scenario: "6-server-crash-" + tc.desc, server: append(tc.settings, pgtest.Crashable())})
			ctx, db, srv, report := e.ctx, e.db, e.db.Server, e.report
			const ttl = 800 * time.Millisecond
			for run := range runs(2) {
				name := fmt.Sprintf("crash:%d", run)
				require.NoError(t, SetupRegister(ctx, db.Pool, name))
				rec := newRecorder(t, ctx, db.Pool)
				wctx, stop := context.WithCancel(ctx)
				var wg sync.WaitGroup
				for i := range 3 {
					w := &leaseWorker{rec: rec, pool: db.Pool, worker: fmt.Sprintf("w%d", i), name: name, ttl: ttl, writes: 4, gap: 5 * time.Millisecond,
						opts: []fencelock.LessorOption{fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, 50*time.Millisecond))}}
					wg.Go(func() { w.run(wctx) })
				}
				time.Sleep(jitter(100*time.Millisecond, 400*time.Millisecond))
				crashed := rec.Now()
				require.NoError(t, srv.Crash(ctx))
				time.Sleep(jitter(0, 2*ttl)) // short outages keep the lease, long ones lose it
				require.NoError(t, srv.Restart(ctx))
				rec.Record(Op{Kind: KindFault, Value: "crash-server", Invoke: crashed, Return: rec.Now()})
				time.Sleep(jitter(300*time.Millisecond, 600*time.Millisecond))
				stop()
				wg.Wait()
				h := finalCheck(t, ctx, db.Pool, rec, report, name)
				report.AddDetect(doneDetect(h)...)
			}
			t.Logf("chaos: scenario=%s detect=Done closing minus server-side expiry (negative: before it)", report.Scenario)
			logReport(t, report)
		})
	}
}
