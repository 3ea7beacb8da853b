package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
)

// Scenario 2: a pause injected between the holder's own validity check (Err() == nil) and its
// fenced write, for up to 1.5 TTL. The pausing holder has no heartbeat (as if its process
// were stalled), so its lease expires during long pauses and a contender takes over and
// writes: the late write must then be rejected by the fence. In the "guard" variant each
// write also runs Lease.GuardTx first in its transaction, which must refuse the expired lease.
func TestScenarioPauseBetweenCheckAndWrite(t *testing.T) {
	t.Parallel()
	for _, guard := range []bool{false, true} {
		t.Run(fmt.Sprintf("guard=%v", guard), func(t *testing.T) {
			t.Parallel()
			e := setup(t, setupOpts{scenario: fmt.Sprintf("2-pause-check-write-guard-%v", guard)})
			ctx, db, report := e.ctx, e.db, e.report
			const ttl = 300 * time.Millisecond
			for run := range runs(3) {
				name := fmt.Sprintf("pause:%d", run)
				rec := newRun(t, ctx, db.Pool, name)
				wctx, stop := context.WithTimeout(ctx, 2500*time.Millisecond)
				var wg sync.WaitGroup
				backoff := backoffUpTo(20 * time.Millisecond)
				paused := &leaseWorker{rec: rec, pool: db.Pool, worker: "paused", name: name, ttl: ttl, writes: 3, guard: guard,
					opts:  []fencelock.LessorOption{fencelock.WithoutHeartbeat(), backoff},
					pause: func() { time.Sleep(jitter(0, ttl*3/2)) }}
				healthy := &leaseWorker{rec: rec, pool: db.Pool, worker: "healthy", name: name, ttl: ttl, writes: 3, gap: 5 * time.Millisecond, guard: guard,
					opts: []fencelock.LessorOption{backoff}}
				wg.Go(func() { paused.run(wctx) })
				wg.Go(func() { healthy.run(wctx) })
				wg.Wait()
				stop()
				h := finalCheck(t, ctx, db.Pool, rec, report, name)
				for _, op := range h { // the pausing holder's Done: trust window end vs server expiry
					if op.Kind == KindDone && op.Worker == "paused" && op.Err != fencelock.ErrReleased.Error() {
						report.AddDetect(op.ServerReturn.Sub(op.Expires))
					}
				}
			}
			t.Logf("chaos: scenario=%s detect=Done closing minus server-side expiry (negative: before it; bound: <= 0)", report.Scenario)
			logReport(t, report)
		})
	}
}
