package integration

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// BenchmarkSemaphore: an uncontended permit and its release (TryAcquire + Release) on a
// semaphore of limit 1, 100 and 10,000 with all but one permit held (a grant counts the
// semaphore's permit rows), beside two one-row UPDATEs.
func BenchmarkSemaphore(b *testing.B) {
	for _, limit := range []int{1, 100, 1000, 10_000} {
		b.Run(fmt.Sprint("Limit", limit), func(b *testing.B) {
			e := benchSetup(b)
			filler, err := fencelock.NewLessor(e.pool, fencelock.WithHolder("filler"))
			if err != nil {
				b.Fatal(err)
			}
			fs, err := fencelock.NewSemaphore(filler, "bench", limit)
			if err != nil {
				b.Fatal(err)
			}
			for range limit - 1 {
				if _, err := fs.TryAcquire(e.ctx, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			l, err := fencelock.NewLessor(e.pool)
			if err != nil {
				b.Fatal(err)
			}
			s, err := fencelock.NewSemaphore(l, "bench", limit)
			if err != nil {
				b.Fatal(err)
			}
			ratio(b, func() error {
				p, err := s.TryAcquire(e.ctx, time.Minute)
				if err != nil {
					return err
				}
				return p.Release(e.ctx)
			}, twice(e.update(1)))
		})
	}
}

// BenchmarkSemaphoreWaiters: n waiters (16, then 200) spread over three pools of 40
// connections (three processes' worth) loop on a semaphore of limit k (Acquire, hold a
// uniform random time in [0, 2 ms), Release) until b.N grants in all. Reports grants per
// second; the wait per grant (p50, p99); the hand-off time, from the start of a Release to the
// return of the Acquire that got the same permit next (p50, p99: how long a freed permit
// takes to reach the head of the queue); the permits' use (time held over k x the wall
// time); and the most backends seen waiting for a lock at once (pg_stat_activity, sampled
// every 5 ms: a waiter's statement waiting behind another's shows there, and the statements
// that block it are logged; FENCELOCK_BENCH_LOCK_LOG=dir logs each wait with its PL/pgSQL line).
func BenchmarkSemaphoreWaiters(b *testing.B) {
	for _, k := range []int{1, 7, 100} {
		for _, n := range []int{16, 200} {
			b.Run(fmt.Sprintf("Limit%d/Waiters%d", k, n), func(b *testing.B) { benchSemaphoreWaiters(b, k, n) })
		}
	}
}

func benchSemaphoreWaiters(b *testing.B, limit, waiters int) {
	e := benchSetup(b)
	pools := make([]*pgxpool.Pool, 3)
	for i := range pools {
		cfg, err := pgxpool.ParseConfig(e.url)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 40
		if pools[i], err = pgxpool.NewWithConfig(e.ctx, cfg); err != nil {
			b.Fatal(err)
		}
		defer pools[i].Close()
	}
	sems := make([]*fencelock.Semaphore, waiters)
	for i := range sems {
		l, err := fencelock.NewLessor(pools[i%len(pools)])
		if err != nil {
			b.Fatal(err)
		}
		if sems[i], err = fencelock.NewSemaphore(l, "waiters", limit); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := sems[0].SetLimit(e.ctx, limit); err != nil { // the semaphore's row, before the timing
		b.Fatal(err)
	}
	var mu sync.Mutex
	var waits, handoffs []time.Duration
	freed := make(map[string]time.Time) // permit name -> start of its last release
	var held time.Duration
	var left atomic.Int64
	left.Store(int64(b.N))
	stop := make(chan struct{})
	var maxLockWaits atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			var n int64
			var what string
			if err := e.pool.QueryRow(e.ctx, `SELECT count(*), coalesce(string_agg(coalesce((SELECT string_agg(DISTINCT substring(b.query from '-- name: (\w+)') || '/' || b.state, ',') FROM pg_stat_activity AS b WHERE b.pid = ANY (pg_blocking_pids(a.pid))), '?'), ' | '), '') FROM pg_stat_activity AS a WHERE a.wait_event_type = 'Lock' AND a.datname = current_database()`).Scan(&n, &what); err == nil && n > maxLockWaits.Load() {
				maxLockWaits.Store(n)
				b.Logf("%d statements waiting for a lock at once, blocked by: %s", n, what)
			}
		}
	})
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, s := range sems {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			for left.Add(-1) >= 0 {
				t0 := time.Now()
				p, err := s.Acquire(e.ctx, time.Minute)
				if err != nil {
					b.Error(err)
					return
				}
				t1 := time.Now()
				mu.Lock()
				if f, ok := freed[p.Name()]; ok {
					handoffs = append(handoffs, t1.Sub(f))
				}
				mu.Unlock()
				time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
				t2 := time.Now()
				mu.Lock()
				freed[p.Name()] = t2
				mu.Unlock()
				if err := p.Release(e.ctx); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				waits = append(waits, t1.Sub(t0))
				held += t2.Sub(t1)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	b.StopTimer()
	close(stop)
	sampler.Wait()
	if len(waits) == 0 || len(handoffs) == 0 {
		return
	}
	slices.Sort(waits)
	slices.Sort(handoffs)
	b.ReportMetric(float64(len(waits))/wall.Seconds(), "grants/s")
	b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "wait-p50-us")
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "wait-p99-us")
	b.ReportMetric(float64(handoffs[len(handoffs)/2].Microseconds()), "handoff-p50-us")
	b.ReportMetric(float64(handoffs[len(handoffs)*99/100].Microseconds()), "handoff-p99-us")
	b.ReportMetric(float64(held)/float64(time.Duration(limit)*wall), "permit-use")
	b.ReportMetric(float64(maxLockWaits.Load()), "max-lock-waits")
}
