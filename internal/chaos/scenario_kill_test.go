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

// Scenario 5a: kill -9 of the holder process. In-process workers wait in Acquire; the time
// from the kill to the next grant is the takeover time, bounded by the TTL plus the retry
// bound of the waiters (their backoff cap) plus what the machine added meanwhile, measured in
// each run from the kill until the takeover is seen (probeMachine): the worst lateness of a
// control timer (the waiters' timers are as late), and three times the worst duration of a
// grant statement (the renewal the child may have had in flight at the kill, which dates the
// expiry from its start on the server; the waiter's last refused attempt, which told it the
// remaining TTL; its grant).
func TestScenarioKillHolder(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "5-kill9-holder"})
	ctx, db, report := e.ctx, e.db, e.report
	const ttl, backoffMax = time.Second, 50 * time.Millisecond
	for run := range runs(3) {
		name := fmt.Sprintf("kill:%d", run)
		rec := newRun(t, ctx, db.Pool, name)
		c := startChild(t, childConfig{URL: db.URL, Worker: "child", Name: name, TTL: ttl, Interval: 10 * time.Millisecond}, rec)
		c.waitGrant(ctx)
		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range 2 {
			w := &leaseWorker{rec: rec, pool: db.Pool, worker: fmt.Sprintf("w%d", i), name: name, ttl: ttl, writes: 2, gap: 5 * time.Millisecond,
				opts: []fencelock.LessorOption{backoffUpTo(backoffMax)}}
			wg.Go(func() { w.run(wctx) })
		}
		time.Sleep(jitter(50*time.Millisecond, 400*time.Millisecond))
		var killedAt atomic.Int64 // UnixNano; read by the probe's goroutines
		machine := probeMachine(ctx, db.Pool, name+":probe", ttl, func() time.Time {
			if ns := killedAt.Load(); ns != 0 {
				return time.Unix(0, ns)
			}
			return time.Now().Add(time.Hour) // not yet killed: nothing counts
		})
		c.kill()
		killedAt.Store(time.Now().UnixNano())
		kill := rec.Record(Op{Worker: "child", Kind: KindFault, Name: name, Value: "kill -9"})
		// The takeover, or a give-up long past any bound (then TakeoverWithinBound reports
		// it as never).
		awaitGrantAfter(ctx, rec, name, rec.History()[kill].Return, 10*(ttl+backoffMax))
		late, grant := machine()
		bound := ttl + backoffMax + late + 3*grant
		time.Sleep(200 * time.Millisecond) // the new holders' writes: workload, not a bound
		stop()
		wg.Wait()
		h := finalCheck(t, ctx, db.Pool, rec, report, name)
		vs := TakeoverWithinBound(h, bound)
		for _, v := range vs {
			t.Errorf("violation: %v", v)
		}
		t.Logf("chaos: scenario=5-kill9-holder run=%d takeover=%v bound=%v (TTL %v + backoff cap %v + timer lateness %v + 3 x grant statement %v)",
			run, TakeoverTimes(h), bound, ttl, backoffMax, late, grant)
		report.AddRun(nil, vs)
		report.runs-- // the takeover check belongs to the same run
		report.AddTakeover(TakeoverTimes(h)...)
	}
	logReport(t, report)
}

// probeMachine measures, from from() until the function it returns is called, what the
// machine adds to a takeover: late, the worst lateness of a control timer (AwaitClosing), and
// grant, the worst duration of a grant statement begun at or after from() (TryAcquire of
// probeName for ttl, on pool, by a lessor of its own, every 10 ms, each released at once).
// from is called from the probe's goroutines.
func probeMachine(ctx context.Context, pool *pgxpool.Pool, probeName string, ttl time.Duration, from func() time.Time) (measured func() (late, grant time.Duration)) {
	stop := make(chan struct{})
	var late, grant time.Duration
	var wg sync.WaitGroup
	wg.Go(func() { late = AwaitClosing(stop, from) })
	wg.Go(func() {
		l, err := fencelock.NewLessor(pool, fencelock.WithHolder("probe"))
		if err != nil {
			panic(err)
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			lease, err := l.TryAcquire(ctx, probeName, ttl)
			if took := time.Since(start); !start.Before(from()) {
				grant = max(grant, took) // only attempts begun from from(): not the dial of the first
			}
			if err == nil {
				_ = lease.Release(ctx)
			}
			sleepCtx(ctx, 10*time.Millisecond)
		}
	})
	return func() (time.Duration, time.Duration) {
		close(stop)
		wg.Wait()
		return late, grant
	}
}

// awaitGrantAfter waits until rec holds a successful grant of name that returned at or after
// after (a time of rec), for at most limit (or until ctx ends), polling every 5 ms.
func awaitGrantAfter(ctx context.Context, rec *Recorder, name string, after, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		for _, op := range rec.History() {
			if op.Kind == KindGrant && op.Outcome == OK && op.Name == name && op.Return >= after {
				return
			}
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
}

// Scenario 5b: pg_terminate_backend of the holders' connections, leases and session advisory
// locks with fencing tokens. A lease holder's heartbeat rides over a lost connection (the
// pool reconnects); an advisory lock is lost with its session, and Done must close within
// twice the watchdog interval, measured from the termination. Writers keep appending with
// their tokens throughout.
func TestScenarioTerminateBackend(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "5-terminate-backend"})
	ctx, db, report := e.ctx, e.db, e.report
	const watchdog = 100 * time.Millisecond
	for run := range runs(4) {
		name := fmt.Sprintf("term:%d", run)
		rec := newRun(t, ctx, db.Pool, name)
		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var pids []uint32
		terminated := make(map[uint32]time.Duration)
		for i := range 2 {
			worker := fmt.Sprintf("adv%d", i)
			locker, err := fencelock.NewAdvisoryLocker(db.Pool, fencelock.WithFencingTokens(), fencelock.WithWatchdogInterval(watchdog))
			require.NoError(t, err)
			wg.Go(func() {
				app := &Appender{Pool: db.Pool, Rec: rec, Worker: worker, Holder: worker}
				for wctx.Err() == nil {
					id := rec.Invoke(Op{Worker: worker, Kind: KindGrant, Name: name, Holder: worker})
					lk, err := locker.TryLock(wctx, name)
					if err != nil {
						rec.Complete(id, Fail, err, nil) // refused or session broken before a grant: no token issued to us
						sleepCtx(wctx, 5*time.Millisecond)
						continue
					}
					rec.Complete(id, OK, nil, func(op *Op) { op.Token = int64(lk.Token()) })
					mu.Lock()
					pids = append(pids, lk.BackendPID())
					mu.Unlock()
					for range 5 {
						if lk.Err() != nil {
							break
						}
						_ = app.Append(wctx, name, lk.Token())
						sleepCtx(wctx, 10*time.Millisecond)
					}
					mu.Lock()
					at, killed := terminated[lk.BackendPID()]
					mu.Unlock()
					if killed { // the session is gone: Done must close within the watchdog bound
						select {
						case <-lk.Done():
							report.AddDetect(rec.Now() - at)
						case <-time.After(2 * time.Second):
							t.Errorf("advisory lock Done not closed 2s after its backend was terminated")
						}
					}
					uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
					_ = lk.Unlock(uctx)
					ucancel()
				}
			})
		}
		lw := &leaseWorker{rec: rec, pool: db.Pool, worker: "lease", name: name + ":lease", ttl: time.Second, writes: 10, gap: 10 * time.Millisecond}
		require.NoError(t, SetupRegister(ctx, db.Pool, lw.name))
		wg.Go(func() { lw.run(wctx) })
		for range 3 {
			time.Sleep(jitter(50*time.Millisecond, 200*time.Millisecond))
			mu.Lock()
			victims := pids
			pids = nil
			mu.Unlock()
			for _, pid := range victims {
				at := rec.Now()
				if db.Server.TerminateBackend(ctx, pid) == nil {
					mu.Lock()
					terminated[pid] = at
					mu.Unlock()
				}
			}
			// and every other backend of the database, the lease holder's among them, but those
			// that hold (or await) an advisory lock: those are terminated above, by pid, at a
			// recorded time, which the watchdog's detection is measured from. They are told apart
			// by pg_locks, not by application_name: a session is labelled "fencelock <name>" only
			// at the watchdog's first probe of its lock, and these locks are mostly held for less
			// than one interval. (pid IS NOT NULL: a prepared transaction's lock has none, and one
			// NULL would make NOT IN spare every backend.)
			_, _ = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid()
				AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND pid IS NOT NULL
				                AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`)
		}
		time.Sleep(2*watchdog + 100*time.Millisecond)
		stop()
		wg.Wait()
		finalCheck(t, ctx, db.Pool, rec, report, name, lw.name)
	}
	t.Logf("chaos: scenario=5-terminate-backend detect_bound=%v (2 x watchdog interval)", 2*watchdog)
	logReport(t, report)
}
