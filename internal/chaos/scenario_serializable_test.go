package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// Scenario 9: the database's default isolation is serializable. Lease workers, advisory
// lockers with fencing tokens and the inventory and payments workloads run on a pool opened
// after the change: every operation either succeeds or fails with a clear error (a
// serialization failure is a definite failure), and no token is ever granted twice, no stock
// goes missing and no order is captured twice.
func TestScenarioSerializable(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "9-serializable", dbSet: "default_transaction_isolation = 'serializable'"})
	ctx, pool, report := e.ctx, e.pool, e.report
	var iso string
	require.NoError(t, pool.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&iso))
	require.Equal(t, "serializable", iso)

	const initial = 40
	for run := range runs(2) {
		name, item, order := fmt.Sprintf("ser:%d", run), fmt.Sprintf("item%d", run), fmt.Sprintf("order%d", run)
		require.NoError(t, SetupRegister(ctx, pool, name))
		require.NoError(t, SetupInventory(ctx, pool, initial, item))
		require.NoError(t, SetupPayments(ctx, pool, order))
		rec := newRecorder(t, ctx, pool)
		wctx, stop := context.WithTimeout(ctx, 2*time.Second)
		var wg sync.WaitGroup
		for i := range 3 {
			w := &leaseWorker{rec: rec, pool: pool, worker: fmt.Sprintf("l%d", i), name: name, ttl: time.Second, writes: 3,
				opts: []fencelock.LessorOption{backoffUpTo(20 * time.Millisecond)}}
			wg.Go(func() { w.run(wctx) })
		}
		for i := range 3 { // advisory lockers: inventory and payments under a fenced session lock
			worker := fmt.Sprintf("a%d", i)
			locker, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
			require.NoError(t, err)
			wg.Go(func() {
				seq := 0
				for wctx.Err() == nil {
					id := rec.Invoke(Op{Worker: worker, Kind: KindGrant, Name: "adv:" + item, Holder: worker})
					lk, err := locker.Lock(wctx, "adv:"+item)
					if err != nil {
						rec.Complete(id, Fail, err, nil)
						continue
					}
					rec.Complete(id, OK, nil, func(op *Op) { op.Token = int64(lk.Token()) })
					_, _ = Decrement(wctx, pool, rec, worker, item, lk.Token(), 1+seq%3)
					seq++
					_, _ = Capture(wctx, pool, rec, worker, order, lk.Token(), fmt.Sprintf("%s-%d", worker, seq))
					uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
					_ = lk.Unlock(uctx)
					ucancel()
				}
			})
		}
		wg.Wait()
		stop()
		h := finalCheck(t, ctx, pool, rec, report, name)
		stock, err := ReadStock(ctx, pool)
		require.NoError(t, err)
		captures, err := ReadCaptures(ctx, pool)
		require.NoError(t, err)
		vs := append(StockConserved(h, initial, map[string]int{item: stock[item]}), CapturedAtMostOnce(h, map[string][]string{order: captures[order]})...)
		for _, v := range vs {
			t.Errorf("violation: %v", v)
		}
		report.AddRun(nil, vs)
		report.runs--
		for _, op := range h { // errors must be clear: no unknown outcome but the run's own end
			if strings.Contains(op.Err, "context deadline exceeded") {
				continue
			}
			if (op.Kind == KindAppend || op.Kind == KindDecrement || op.Kind == KindCapture) && op.Outcome == Unknown {
				t.Errorf("unclear outcome without a fault: %v", op)
			}
		}
	}
	logReport(t, report)
}
