package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// soakEnv names the soak duration, e.g. FENCELOCK_SOAK=10m. Unset, TestSoak does nothing.
const soakEnv = "FENCELOCK_SOAK"

// TestSoak runs the fenced-register workload under a random mix of faults for the duration
// in FENCELOCK_SOAK, in rounds of a few seconds, each on a fresh resource and checked on its
// own (porcupine and every register invariant). The faults: latency, blackhole and
// connection resets on the holders' connections (toxiproxy), pg_terminate_backend of every
// backend, and a GuardTx transaction left idle past idle_in_transaction_session_timeout.
// FENCELOCK_SOAK_FAULTS (e.g. "latency,reset") restricts the mix. Without FENCELOCK_SOAK it
// is skipped (and says so), having checked nothing.
func TestSoak(t *testing.T) {
	v := os.Getenv(soakEnv)
	if v == "" {
		t.Skip("soak off: set FENCELOCK_SOAK=<duration> (e.g. 10m) to run it") // opt-in; reported as skipped, not passed

	}
	dur, err := time.ParseDuration(v)
	require.NoError(t, err, "FENCELOCK_SOAK")
	// e.pool is the contenders' pool, direct, with the new setting; e.hpool the holders'.
	e := setup(t, setupOpts{scenario: "soak", timeout: dur + 2*time.Minute, proxy: true, dbSet: "idle_in_transaction_session_timeout = '200ms'"})
	ctx, db, tp, hpool, pool, report := e.ctx, e.db, e.tp, e.hpool, e.pool, e.report

	kinds := []string{"latency", "blackhole", "reset", "terminate"}
	if v := os.Getenv("FENCELOCK_SOAK_FAULTS"); v != "" { // e.g. "latency,reset": only these
		kinds = strings.Split(v, ",")
	}
	faults := map[string]int{}
	end := time.Now().Add(dur)
	const ttl = 500 * time.Millisecond
	for round := 0; time.Now().Before(end); round++ {
		name := fmt.Sprintf("soak:%d", round)
		rec := newRun(t, ctx, pool, name)
		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		backoff := backoffUpTo(20 * time.Millisecond)
		for i, p := range []*pgxpool.Pool{hpool, hpool, pool, pool} {
			w := &leaseWorker{rec: rec, pool: p, worker: fmt.Sprintf("w%d", i), name: name, ttl: ttl, writes: 3, gap: 5 * time.Millisecond, guard: i%2 == 0,
				opts: []fencelock.LessorOption{backoff}}
			if i == 1 { // leaves its guarded transactions idle, at times past the timeout
				iw := &idleWorker{leaseWorker: *w, idle: func() { time.Sleep(jitter(0, 300*time.Millisecond)) }}
				wg.Go(func() { iw.run(wctx) })
				continue
			}
			wg.Go(func() { w.run(wctx) })
		}
		for range 3 {
			time.Sleep(jitter(50*time.Millisecond, 400*time.Millisecond))
			at := rec.Now()
			kind := kinds[rand.IntN(len(kinds))]
			faults[kind]++
			switch kind {
			case "latency":
				require.NoError(t, tp.add("lat", "latency", "downstream", map[string]int64{"latency": jitter(50*time.Millisecond, 800*time.Millisecond).Milliseconds()}))
				time.Sleep(jitter(100*time.Millisecond, 800*time.Millisecond))
				tp.remove("lat")
			case "blackhole":
				require.NoError(t, tp.add("bh-up", "timeout", "upstream", map[string]int64{"timeout": 0}))
				require.NoError(t, tp.add("bh-down", "timeout", "downstream", map[string]int64{"timeout": 0}))
				time.Sleep(jitter(100*time.Millisecond, 2*ttl))
				require.NoError(t, tp.reset())
			case "reset":
				require.NoError(t, tp.add("reset", "reset_peer", []string{"upstream", "downstream"}[rand.IntN(2)], map[string]int64{"timeout": 0}))
				time.Sleep(jitter(0, 20*time.Millisecond))
				tp.remove("reset")
			case "terminate":
				_, _ = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
			}
			rec.Record(Op{Kind: KindFault, Value: kind, Invoke: at, Return: rec.Now()})
		}
		time.Sleep(200 * time.Millisecond)
		stop()
		wg.Wait()
		h := finalCheck(t, ctx, pool, rec, report, name)
		report.AddDetect(doneDetect(h)...)
	}
	t.Logf("chaos: scenario=soak duration=%v faults=%v detect=Done closing minus server-side expiry (negative: before it)", dur, faults)
	logReport(t, report)
}
