package chaos

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Scenario 8: 200 goroutines (each with a lessor of its own) contend for one lease name with
// a 2 s TTL. A healthy holder must never lose its lease (no spurious expiry: every Done
// closing is a release), nobody deadlocks (the run ends and grants keep coming), and tokens
// rise strictly in grant order (checked on the ledger and by porcupine).
func TestScenarioContention200(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "8-contention-200", poolConfig: func(cfg *pgxpool.Config) { cfg.MaxConns = 40 }})
	ctx, pool, report := e.ctx, e.pool, e.report
	for run := range runs(1) {
		name := fmt.Sprintf("hot:%d", run)
		rec := newRun(t, ctx, pool, name)
		wctx, stop := context.WithTimeout(ctx, 4*time.Second)
		var wg sync.WaitGroup
		var spurious atomic.Int64
		for i := range 200 {
			w := &leaseWorker{rec: rec, pool: pool, worker: fmt.Sprintf("g%d", i), name: name, ttl: 2 * time.Second, writes: 2,
				opts: []fencelock.LessorOption{fencelock.WithBackoff(fencelock.ExponentialBackoff(2*time.Millisecond, 100*time.Millisecond))},
				onDone: func(l *fencelock.Lease, _ time.Duration) {
					if l.Err() != fencelock.ErrReleased {
						spurious.Add(1)
					}
				}}
			wg.Go(func() { w.run(wctx) })
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Fatal("deadlock: workers did not stop within 30s of the end of the run")
		}
		stop()
		h := finalCheck(t, ctx, pool, rec, report, name)
		grants := 0
		for _, op := range h {
			if op.Kind == KindGrant && op.Outcome == OK {
				grants++
			}
		}
		require.Greater(t, grants, 10, "grants must keep coming")
		require.Zero(t, spurious.Load(), "a healthy holder lost its lease")
	}
	logReport(t, report)
}
