package integration

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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
// second; the wait per grant (p50, p99); the Release call's own time (p50, p99: the part of a
// hand-off spent in the releasing statement); the hand-off time, from the start of a Release to the
// return of the Acquire that got the same permit next (p50, p99: how long a freed permit
// takes to reach the head of the queue); the permits' use (time held over k x the wall
// time); and the backends seen waiting for a lock (lockSampler: a waiter's statement waiting
// behind another's shows there, and the statements that block it are logged;
// FENCELOCK_BENCH_LOCK_LOG=dir logs each wait with its PL/pgSQL line). Then the floor: the
// p50 and p99 latency of a one-row UPDATE in a closed loop at the permits' concurrency
// (closedLoopWriteFloor), what a hand-off, one such write and a wake-up, cannot beat.
func BenchmarkSemaphoreWaiters(b *testing.B) {
	for _, k := range []int{1, 7, 100} {
		for _, n := range []int{16, 200} {
			b.Run(fmt.Sprintf("Limit%d/Waiters%d", k, n), func(b *testing.B) { benchSemaphoreWaiters(b, k, n, false) })
		}
	}
}

// BenchmarkSemaphoreWaitersLoweredLimit: as BenchmarkSemaphoreWaiters, on a semaphore whose
// limit SetLimit lowered from 16 to 8 while a permit above the new limit (slot 15) stays held
// by another lessor for the whole run, so that every grant counts the permits (issue 30):
// 7 permits for the waiters (64, then 200).
func BenchmarkSemaphoreWaitersLoweredLimit(b *testing.B) {
	for _, n := range []int{64, 200} {
		b.Run(fmt.Sprintf("Limit8/Waiters%d", n), func(b *testing.B) { benchSemaphoreWaiters(b, 8, n, true) })
	}
}

func benchSemaphoreWaiters(b *testing.B, limit, waiters int, lowered bool) {
	e := benchSetup(b)
	pools := benchPools(b, e, 3, 40)
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
	usable := limit
	if lowered {
		// Slots 0 .. 2*limit-1 granted to a filler, the limit lowered to limit, and every
		// permit of the filler released but the top one: grants count until it ends.
		filler, err := fencelock.NewLessor(e.pool, fencelock.WithHolder("filler"))
		if err != nil {
			b.Fatal(err)
		}
		fs, err := fencelock.NewSemaphore(filler, "waiters", 2*limit)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := fs.SetLimit(e.ctx, 2*limit); err != nil {
			b.Fatal(err)
		}
		var top *fencelock.Lease
		var low []*fencelock.Lease
		for range 2 * limit {
			p, err := fs.TryAcquire(e.ctx, time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			if p.Name() == fmt.Sprintf("waiters#%d", 2*limit-1) {
				top = p
			} else {
				low = append(low, p)
			}
		}
		if _, err := fs.SetLimit(e.ctx, limit); err != nil {
			b.Fatal(err)
		}
		for _, p := range low {
			if err := p.Release(e.ctx); err != nil {
				b.Fatal(err)
			}
		}
		defer func() { _ = top.Release(e.ctx) }()
		usable = limit - 1
	} else if _, err := sems[0].SetLimit(e.ctx, limit); err != nil { // the semaphore's row, before the timing
		b.Fatal(err)
	}
	var mu sync.Mutex
	var waits, handoffs, releases []time.Duration
	freed := make(map[string]time.Time) // permit name -> start of its last release
	var held time.Duration
	var left atomic.Int64
	left.Store(int64(b.N))
	locks := sampleLockWaits(b, e)
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
				t3 := time.Now()
				mu.Lock()
				releases = append(releases, t3.Sub(t2))
				waits = append(waits, t1.Sub(t0))
				held += t2.Sub(t1)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	b.StopTimer()
	locks.report(b)
	if len(waits) == 0 || len(handoffs) == 0 {
		return
	}
	slices.Sort(waits)
	slices.Sort(handoffs)
	slices.Sort(releases)
	b.ReportMetric(float64(len(waits))/wall.Seconds(), "grants/s")
	b.ReportMetric(float64(releases[len(releases)/2].Microseconds()), "release-p50-us")
	b.ReportMetric(float64(releases[len(releases)*99/100].Microseconds()), "release-p99-us")
	b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "wait-p50-us")
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "wait-p99-us")
	b.ReportMetric(float64(handoffs[len(handoffs)/2].Microseconds()), "handoff-p50-us")
	b.ReportMetric(float64(handoffs[len(handoffs)*99/100].Microseconds()), "handoff-p99-us")
	b.ReportMetric(float64(held)/float64(time.Duration(usable)*wall), "permit-use")
	floor := closedLoopWriteFloor(b, e, usable)
	b.ReportMetric(float64(floor.quantile(0.5).Microseconds()), "floor-p50-us")
	b.ReportMetric(float64(floor.quantile(0.99).Microseconds()), "floor-p99-us")
}

// closedLoopWriteFloor measures, on e's server, the latency of a one-row UPDATE committed by
// each of clients goroutines in a closed loop (each on a row of its own, back to back, as
// the holders of a semaphore's permits release and acquire again): the latency any durable
// write sees at that concurrency on this machine, and so the floor under a permit's hand-off,
// which is one such write (the release that gives the permit) plus the waiter's wake-up. By
// Little's law it is about clients / (writes a second the server sustains).
func closedLoopWriteFloor(b *testing.B, e *benchEnv, clients int) *floorRow {
	b.Helper()
	if _, err := e.pool.Exec(e.ctx, `CREATE TABLE IF NOT EXISTS closed_loop (id int PRIMARY KEY, v bigint NOT NULL);
		INSERT INTO closed_loop SELECT g, 0 FROM generate_series(0, 999) AS g ON CONFLICT DO NOTHING`); err != nil {
		b.Fatal(err)
	}
	rows := floorTable(b, clients, []floorOp{{"write", func(c int) (func() error, error) {
		return func() error {
			_, err := e.pool.Exec(e.ctx, `UPDATE closed_loop SET v = v + 1 WHERE id = $1`, c)
			return err
		}, nil
	}}})
	return rows[0]
}

// BenchmarkSemaphoreFirstAcquires: b.N rounds; in each, 64 lessors spread over three pools of
// 40 connections make the first acquires of a brand-new semaphore of limit k (4, then 64) at
// the same instant (Acquire, hold a uniform random time in [0, 1 ms), Release), so that its
// row is created while the others look for it (issue 30). Reports rounds per second, the time
// to the round's last grant (p50, p99), and the backends seen waiting for a lock (lockSampler).
func BenchmarkSemaphoreFirstAcquires(b *testing.B) {
	for _, k := range []int{4, 64} {
		b.Run(fmt.Sprintf("Limit%d/Goroutines64", k), func(b *testing.B) { benchSemaphoreFirstAcquires(b, k, 64) })
	}
}

func benchSemaphoreFirstAcquires(b *testing.B, limit, goroutines int) {
	e := benchSetup(b)
	pools := benchPools(b, e, 3, 40)
	lessors := make([]*fencelock.Lessor, goroutines)
	for i := range lessors {
		var err error
		if lessors[i], err = fencelock.NewLessor(pools[i%len(pools)]); err != nil {
			b.Fatal(err)
		}
	}
	var rounds []time.Duration
	locks := sampleLockWaits(b, e)
	b.ResetTimer()
	start := time.Now()
	for round := range b.N {
		name := fmt.Sprintf("first-%d", round)
		sems := make([]*fencelock.Semaphore, goroutines)
		for i, l := range lessors {
			var err error
			if sems[i], err = fencelock.NewSemaphore(l, name, limit); err != nil {
				b.Fatal(err)
			}
		}
		ready := make(chan struct{})
		var wg sync.WaitGroup
		for i, s := range sems {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(round)))
				<-ready
				p, err := s.Acquire(e.ctx, time.Minute)
				if err != nil {
					b.Error(err)
					return
				}
				time.Sleep(time.Duration(rng.Int64N(int64(time.Millisecond))))
				if err := p.Release(e.ctx); err != nil {
					b.Error(err)
				}
			})
		}
		t0 := time.Now()
		close(ready)
		wg.Wait()
		rounds = append(rounds, time.Since(t0))
	}
	wall := time.Since(start)
	b.StopTimer()
	locks.report(b)
	slices.Sort(rounds)
	b.ReportMetric(float64(len(rounds))/wall.Seconds(), "rounds/s")
	b.ReportMetric(float64(rounds[len(rounds)/2].Microseconds()), "round-p50-us")
	b.ReportMetric(float64(rounds[len(rounds)*99/100].Microseconds()), "round-p99-us")
}

// benchPools returns n pools of conns connections each on e's database (n processes' worth),
// closed at the end of the benchmark.
func benchPools(b *testing.B, e *benchEnv, n int, conns int32) []*pgxpool.Pool {
	b.Helper()
	pools := make([]*pgxpool.Pool, n)
	for i := range pools {
		cfg, err := pgxpool.ParseConfig(e.url)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = conns
		if pools[i], err = pgxpool.NewWithConfig(e.ctx, cfg); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pools[i].Close)
	}
	return pools
}

// lockSampler samples, every 5 ms, the backends of the benchmark's database (datname =
// current_database(): never another database of the server) that wait for a lock
// (pg_stat_activity.wait_event_type = 'Lock'), each with the statements that block it
// (pg_blocking_pids), named by their sqlc name. A grant attempt (SemaphoreAcquire: a waiter's
// statement, or a try's) waiting for another's row lock or insert (wait events tuple and
// transactionid) is counted apart: the promise is that none does. So is one waiting, at its
// commit, for PostgreSQL's lock on notifying commits (wait event object), which a
// transaction that NOTIFYs holds from its commit's start to its end.
type lockSampler struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	samples int64            // samples taken
	sum     int64            // backends waiting for a lock, over all samples
	max     int64            // the most seen waiting at once
	behind  int64            // sampled waits of a SemaphoreAcquire for another's row lock or insert
	notify  int64            // sampled waits of a SemaphoreAcquire for the lock on notifying commits
	errs    int64            // samples that failed (counted, not fatal: the pool may be busy)
	extend  map[string]int64 // sampled waits for a relation's extension lock, by relation
}

func sampleLockWaits(b *testing.B, e *benchEnv) *lockSampler {
	s := &lockSampler{stop: make(chan struct{}), extend: map[string]int64{}}
	s.wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			var n, behind, notify int64
			var what, extended string
			err := e.pool.QueryRow(e.ctx, `WITH w AS (
					SELECT a.pid, a.wait_event, coalesce(substring(a.query from '-- name: (\w+)'), left(a.query, 40)) AS stmt,
					       (SELECT string_agg(DISTINCT coalesce(substring(bl.query from '-- name: (\w+)'), left(bl.query, 40)) || '/' || bl.state, ',')
					        FROM pg_stat_activity AS bl WHERE bl.pid = ANY (pg_blocking_pids(a.pid))) AS blockers,
					       (SELECT string_agg(l.relation::regclass::text, ',') FROM pg_locks AS l
					        WHERE l.pid = a.pid AND l.locktype = 'extend' AND NOT l.granted) AS extended
					FROM pg_stat_activity AS a
					WHERE a.wait_event_type = 'Lock' AND a.datname = current_database())
				SELECT count(*),
				       count(*) FILTER (WHERE stmt = 'SemaphoreAcquire' AND blockers LIKE '%SemaphoreAcquire/%' AND wait_event IN ('tuple', 'transactionid')),
				       count(*) FILTER (WHERE stmt = 'SemaphoreAcquire' AND wait_event = 'object'),
				       coalesce(string_agg(stmt || ' <- ' || coalesce(blockers, '?') || ' (' || wait_event || ')', ' | '), ''),
				       coalesce(string_agg(extended, ','), '')
				FROM w`).Scan(&n, &behind, &notify, &what, &extended)
			if err != nil {
				s.errs++
				continue
			}
			s.samples++
			s.sum += n
			for _, rel := range strings.Split(extended, ",") {
				if rel != "" {
					s.extend[rel]++
				}
			}
			s.behind += behind
			s.notify += notify
			if n > s.max {
				s.max = n
				b.Logf("%d statements waiting for a lock at once: %s", n, what)
			}
		}
	})
	return s
}

// report stops the sampler and reports: the most backends seen waiting for a lock at once
// (max-lock-waits), their mean over the samples (mean-lock-waits), the samples taken
// (lock-samples), the sampled waits of a grant attempt for another's row lock or insert
// (acquire-behind-acquire), and for the lock on notifying commits (acquire-notify-waits).
func (s *lockSampler) report(b *testing.B) {
	close(s.stop)
	s.wg.Wait()
	b.ReportMetric(float64(s.max), "max-lock-waits")
	if s.samples > 0 {
		b.ReportMetric(float64(s.sum)/float64(s.samples), "mean-lock-waits")
	}
	b.ReportMetric(float64(s.samples), "lock-samples")
	b.ReportMetric(float64(s.behind), "acquire-behind-acquire")
	b.ReportMetric(float64(s.notify), "acquire-notify-waits")
	if s.errs > 0 {
		b.Logf("%d samples failed", s.errs)
	}
	if len(s.extend) > 0 {
		b.Logf("sampled waits for a relation's extension lock, by relation: %v", s.extend)
	}
}
