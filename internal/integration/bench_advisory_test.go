package integration

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// BenchmarkAdvisoryTryLockUnlock: a session lock taken and released, beside two SELECT 1
// round trips (target: within 1.1x).
func BenchmarkAdvisoryTryLockUnlock(b *testing.B) {
	e := benchSetup(b)
	a := benchLocker(b, e.pool)
	ratio(b, takeAndEnd(heldLock(e.ctx, a.TryLock, "bench")), twice(e.selectOne))
}

// BenchmarkHandoff measures the time from a holder's unlock or release to the grant of a
// waiter that was already waiting, and reports its p50 and p99 in microseconds. Advisory
// waiters wait in the server's lock queue; lease waiters wait in the name's queue, handed the
// lease by the release and woken by NOTIFY (before issue 10 they polled with the backoff).
func BenchmarkHandoff(b *testing.B) {
	b.Run("Advisory", func(b *testing.B) {
		e := benchSetup(b)
		pool := bigBenchPool(b, e)
		holder, _ := fencelock.NewAdvisoryLocker(pool)
		waiter, _ := fencelock.NewAdvisoryLocker(pool)
		handoff(b, heldLock(e.ctx, holder.TryLock, "h"), heldLock(e.ctx, waiter.Lock, "h"))
	})
	b.Run("Lease", func(b *testing.B) {
		e := benchSetup(b)
		holder, _ := fencelock.NewLessor(e.pool)
		waiter, _ := fencelock.NewLessor(e.pool)
		handoff(b, heldLease(e.ctx, holder.TryAcquire, "h", time.Minute), heldLease(e.ctx, waiter.Acquire, "h", time.Minute))
	})
}

func bigBenchPool(b *testing.B, e *benchEnv) *pgxpool.Pool {
	cfg := e.pool.Config().Copy()
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// handoff: hold, start the waiter, let it settle into waiting (20ms), release, and time until
// the waiter holds.
func handoff(b *testing.B, hold, wait func() (func() error, error)) {
	b.Helper()
	var lat []time.Duration
	for b.Loop() {
		release, err := hold()
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		errs := make(chan error, 1)
		var unlockWaiter func() error
		go func() {
			u, err := wait()
			if err != nil {
				errs <- err
				return
			}
			unlockWaiter = u
			got <- time.Now()
		}()
		time.Sleep(20 * time.Millisecond) // the waiter is queued or polling by now
		start := time.Now()
		if err := release(); err != nil {
			b.Fatal(err)
		}
		select {
		case t := <-got:
			lat = append(lat, t.Sub(start))
		case err := <-errs:
			b.Fatal(err)
		}
		if err := unlockWaiter(); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}
