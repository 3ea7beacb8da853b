package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/ratelimit"
)

// startRedis starts a redis-server (Debian's package; the benchmark skips without it) on a
// free loopback port, stopped at cleanup. With FENCELOCK_BENCH_FSYNC=on it appends every write
// to its log and fsyncs it (appendfsync always), the durability of a Postgres commit with
// fsync on; otherwise it persists nothing, as Postgres under pgtest (fsync=off) flushes nothing.
func startRedis(b *testing.B) *redis.Client {
	b.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		b.Skip("redis-server not installed (apt-get install redis-server)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--dir", b.TempDir()}
	if os.Getenv("FENCELOCK_BENCH_FSYNC") == "on" {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 32})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for i := 0; ; i++ {
		if err := rdb.Ping(ctx).Err(); err == nil {
			break
		} else if i > 200 {
			b.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return rdb
}

// BenchmarkRateLimit: one request (ratelimit.Limiter.Allow, GCRA, 1,000 keys at random, each used
// once before the timing; a limit high enough that each is allowed) against a one-row UPDATE of a 1,000-row table and a SELECT
// 1 round trip, on one server, and go-redis/redis_rate v10 (GCRA in a Lua script) on a local
// redis-server: serially, alternating (Serial), and from 16 goroutines at once for a fixed
// count each, one kind after the other (Parallel16). Reports microseconds per call and, as
// throughput ratios, update-x (the UPDATE's time over ours: the target is >= 0.9) and redis-x
// (redis_rate's time over ours).
func BenchmarkRateLimit(b *testing.B) {
	e := benchSetup(b)
	rdb := startRedis(b)
	if _, err := e.pool.Exec(e.ctx, `CREATE TABLE bench1k (id int PRIMARY KEY, v bigint NOT NULL) WITH (fillfactor = 70);
		INSERT INTO bench1k SELECT g, 0 FROM generate_series(1, 1000) g`); err != nil {
		b.Fatal(err)
	}
	peer := redis_rate.NewLimiter(rdb)
	peerLimit := redis_rate.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1000}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "key:" + strconv.Itoa(i)
	}
	rl, err := ratelimit.New(e.pool, ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000})
	if err != nil {
		b.Fatal(err)
	}
	// opsOn returns the four operations with the database side on pool.
	opsOn := func(pool *pgxpool.Pool) []func(rng *rand.Rand) error {
		r, err := ratelimit.New(pool, ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000})
		if err != nil {
			b.Fatal(err)
		}
		return []func(rng *rand.Rand) error{
			func(*rand.Rand) error {
				var one int
				return pool.QueryRow(e.ctx, `SELECT 1`).Scan(&one)
			},
			func(rng *rand.Rand) error {
				_, err := pool.Exec(e.ctx, `UPDATE bench1k SET v = v + 1 WHERE id = $1`, 1+rng.IntN(1000))
				return err
			},
			func(rng *rand.Rand) error {
				res, err := r.Allow(e.ctx, keys[rng.IntN(len(keys))])
				if err == nil && res.Allowed != 1 {
					err = fmt.Errorf("refused: %+v", res)
				}
				return err
			},
			func(rng *rand.Rand) error {
				res, err := peer.Allow(e.ctx, keys[rng.IntN(len(keys))], peerLimit)
				if err == nil && res.Allowed != 1 {
					err = fmt.Errorf("redis_rate refused: %+v", res)
				}
				return err
			},
		}
	}
	names := []string{"select1", "update", "fencelock", "redis_rate"}
	report := func(b *testing.B, spent []time.Duration, n int) {
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
		for i, name := range names {
			b.ReportMetric(us(spent[i]), name+"-us")
		}
		b.ReportMetric(float64(spent[1])/float64(spent[2]), "update-x")
		b.ReportMetric(float64(spent[3])/float64(spent[2]), "redis-x")
	}
	// Every key's first request (which creates its row) before any timing.
	for _, k := range keys {
		if _, err := rl.Allow(e.ctx, k); err != nil {
			b.Fatal(err)
		}
		if _, err := peer.Allow(e.ctx, k, peerLimit); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("Serial", func(b *testing.B) {
		ops := opsOn(e.pool)
		rng := rand.New(rand.NewPCG(1, 2))
		for range 300 {
			for _, op := range ops {
				if err := op(rng); err != nil {
					b.Fatal(err)
				}
			}
		}
		spent := make([]time.Duration, len(ops))
		n := 0
		for b.Loop() {
			for i, op := range ops {
				t0 := time.Now()
				if err := op(rng); err != nil {
					b.Fatal(names[i], err)
				}
				spent[i] += time.Since(t0)
			}
			n++
		}
		report(b, spent, n)
	})
	b.Run("Parallel16", func(b *testing.B) {
		cfg, err := pgxpool.ParseConfig(e.url)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 16 // a connection per caller, as redis's client has
		pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		ops := opsOn(pool)
		spent := make([]time.Duration, len(ops))
		n := 0
		for b.Loop() {
			const per = 200
			for i, op := range ops {
				var wg sync.WaitGroup
				var failed atomic.Value
				t0 := time.Now()
				for g := range 16 {
					wg.Go(func() {
						rng := rand.New(rand.NewPCG(uint64(g), uint64(n)))
						for range per {
							if err := op(rng); err != nil {
								failed.Store(err)
								return
							}
						}
					})
				}
				wg.Wait()
				spent[i] += time.Since(t0)
				if err := failed.Load(); err != nil {
					b.Fatal(names[i], err)
				}
			}
			n += 16 * per
		}
		report(b, spent, n)
	})
}

// BenchmarkRateLimitHotKey: 16 goroutines on one key (a limit high enough that all are
// allowed): every request of the key is decided under its row lock, one after the other.
// Reports microseconds per request (wall time / requests) for fencelock and redis_rate, and
// for 16 goroutines updating one row, the floor of any design that keeps a key's state in one
// row.
func BenchmarkRateLimitHotKey(b *testing.B) {
	e := benchSetup(b)
	rdb := startRedis(b)
	r, err := ratelimit.New(e.pool, ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000})
	if err != nil {
		b.Fatal(err)
	}
	peer := redis_rate.NewLimiter(rdb)
	peerLimit := redis_rate.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1000}
	ops := []func() error{
		func() error { return e.update(1)() },
		func() error { _, err := r.Allow(e.ctx, "hot"); return err },
		func() error { _, err := peer.Allow(e.ctx, "hot", peerLimit); return err },
	}
	spent := make([]time.Duration, len(ops))
	n := 0
	for b.Loop() {
		const per = 200
		for i, op := range ops {
			var wg sync.WaitGroup
			t0 := time.Now()
			for range 16 {
				wg.Go(func() {
					for range per {
						if err := op(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			spent[i] += time.Since(t0)
		}
		n += 16 * per
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	b.ReportMetric(us(spent[0]), "update-us")
	b.ReportMetric(us(spent[1]), "fencelock-us")
	b.ReportMetric(us(spent[2]), "redis_rate-us")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "update-x")
}

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

// BenchmarkMultiLock: TryAcquireAll of n names and the set's release (n + 1 statements),
// beside n TryAcquire + Release of the same names one by one (2n statements), for n = 1, 5, 20.
func BenchmarkMultiLock(b *testing.B) {
	for _, n := range []int{1, 5, 20} {
		b.Run(fmt.Sprint("Names", n), func(b *testing.B) {
			e := benchSetup(b)
			l, err := fencelock.NewLessor(e.pool)
			if err != nil {
				b.Fatal(err)
			}
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprint("multi:", i)
			}
			ratio(b, func() error {
				set, err := l.TryAcquireAll(e.ctx, names, time.Minute)
				if err != nil {
					return err
				}
				return set.Release(e.ctx)
			}, func() error {
				for _, name := range names {
					lease, err := l.TryAcquire(e.ctx, name, time.Minute)
					if err != nil {
						return err
					}
					if err := lease.Release(e.ctx); err != nil {
						return err
					}
				}
				return nil
			})
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
