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

// Scenario 12: a leader process (a candidate of an election, its term a lease of the
// election's name) paused with SIGSTOP past its TTL, then resumed. Two in-process candidates
// campaign meanwhile, are elected in turn and make fenced writes; the resumed leader keeps
// writing with its old term's token, and every such write must be rejected. The history
// checker holds the election to what it holds leases to: terms' tokens unique and rising, no
// write of an older term accepted after a newer term's first write, and the dead leader's
// writes rejected as stale.
func TestScenarioSIGSTOPLeader(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "12-sigstop-leader"})
	ctx, db, report := e.ctx, e.db, e.report
	const ttl = time.Second
	stale := 0
	for run := range runs(2) {
		name := fmt.Sprintf("election:%d", run)
		require.NoError(t, SetupRegister(ctx, db.Pool, name))
		rec := newRecorder(t, ctx, db.Pool)
		c := startChild(t, childConfig{URL: db.URL, Worker: "leader", Name: name, TTL: ttl, Interval: 20 * time.Millisecond, Election: true}, rec)
		c.waitGrant(ctx)

		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range 2 {
			w := &leaseWorker{rec: rec, pool: db.Pool, worker: fmt.Sprintf("c%d", i), name: name, ttl: ttl, writes: 3, gap: 10 * time.Millisecond, election: true,
				opts: []fencelock.LessorOption{fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, 50*time.Millisecond))}}
			wg.Go(func() { w.run(wctx) })
		}
		time.Sleep(jitter(0, 300*time.Millisecond))
		stopped := rec.Now()
		c.signal(syscall.SIGSTOP)
		time.Sleep(ttl + jitter(100*time.Millisecond, ttl))
		c.signal(syscall.SIGCONT)
		resumed := rec.Now()
		rec.Record(Op{Worker: "leader", Kind: KindFault, Value: "sigstop", Invoke: stopped, Return: resumed})
		time.Sleep(jitter(200*time.Millisecond, 500*time.Millisecond))
		c.finish(10 * time.Second)
		stop()
		wg.Wait()

		h := finalCheck(t, ctx, db.Pool, rec, report, name)
		stale += staleCount(h, "leader")
	}
	t.Logf("chaos: scenario=12-sigstop-leader stale_rejected=%d", stale)
	require.Positive(t, stale, "the resumed leader's writes must have been rejected as stale")
	logReport(t, report)
}
