package chaos

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Scenario 1: a holder process paused with SIGSTOP past its TTL, then resumed. Two in-process
// workers take the lease over and write; the resumed child keeps writing with its old token
// (a write in flight) and every such write must be rejected by the fence.
func TestScenarioSIGSTOP(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "1-sigstop-holder"})
	ctx, db, report := e.ctx, e.db, e.report
	const ttl = time.Second
	stale := 0
	var resumeDetect []time.Duration
	for run := range runs(3) {
		name := fmt.Sprintf("sigstop:%d", run)
		require.NoError(t, SetupRegister(ctx, db.Pool, name))
		rec := newRecorder(t, ctx, db.Pool)
		c := startChild(t, childConfig{URL: db.URL, Worker: "child", Name: name, TTL: ttl, Interval: 20 * time.Millisecond}, rec)
		c.waitGrant(ctx)

		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range 2 {
			w := &leaseWorker{rec: rec, pool: db.Pool, worker: fmt.Sprintf("w%d", i), name: name, ttl: ttl, writes: 3, gap: 10 * time.Millisecond,
				opts: []fencelock.LessorOption{fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, 50*time.Millisecond))}}
			wg.Go(func() { w.run(wctx) })
		}
		time.Sleep(jitter(0, 300*time.Millisecond))
		stopped := rec.Now()
		c.signal(syscall.SIGSTOP)
		time.Sleep(ttl + jitter(100*time.Millisecond, ttl))
		c.signal(syscall.SIGCONT)
		resumed := rec.Now()
		rec.Record(Op{Worker: "child", Kind: KindFault, Value: "sigstop", Invoke: stopped, Return: resumed})
		time.Sleep(jitter(200*time.Millisecond, 500*time.Millisecond))
		c.finish(10 * time.Second)
		stop()
		wg.Wait()

		h := finalCheck(t, ctx, db.Pool, rec, report, name)
		stale += staleCount(h, "child")
		for _, op := range h {
			if op.Kind == KindDone && op.Worker == "child" && op.Invoke >= resumed {
				resumeDetect = append(resumeDetect, op.Return-resumed)
			}
		}
	}
	// Detection here: from SIGCONT to the resumed holder's Done closing (it slept through
	// the whole trust window).
	report.AddDetect(resumeDetect...)
	t.Logf("chaos: scenario=1-sigstop-holder stale_rejected=%d", stale)
	require.Positive(t, stale, "the resumed child's writes must have been rejected as stale")
	logReport(t, report)
}
