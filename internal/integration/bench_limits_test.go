package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/ratelimit"
)

// startRedis starts a redis-server (Debian's package; the benchmark skips without it) on a
// free loopback port, stopped at cleanup. With FENCELOCK_BENCH_FSYNC=on it appends every write
// to its log and fsyncs it (appendfsync always), the durability of a Postgres commit with
// fsync on; otherwise it persists nothing, as Postgres under pgtest (fsync=off) flushes nothing.
func startRedis(b *testing.B) *redis.Client {
	b.Helper()
	if os.Getenv("FENCELOCK_BENCH_FSYNC") == "on" {
		return startRedisWith(b, "--appendonly", "yes", "--appendfsync", "always")
	}
	return startRedisWith(b, "--appendonly", "no")
}

// startRedisWith starts a redis-server as startRedis does, with persistence set by the
// arguments persist (e.g. "--appendonly", "yes", "--appendfsync", "everysec"); it never
// snapshots (--save "").
func startRedisWith(b *testing.B, persist ...string) *redis.Client {
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
	args = append(args, persist...)
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

// run16 runs 16 goroutines at once; goroutine g (0..15) makes its call with newCall(g) and
// calls it per times, stopping at its first error. It returns the wall time from the first
// start to the last end, and an error of a goroutine that stopped on one (nil if none did).
func run16(per int, newCall func(g int) func() error) (time.Duration, error) {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed error
	)
	t0 := time.Now()
	for g := range 16 {
		wg.Go(func() {
			call := newCall(g)
			for range per {
				if err := call(); err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0), failed
}

// BenchmarkRateLimit: one request (ratelimit.Limiter.Allow, GCRA, 1,000 keys at random, each used
// once before the timing; a limit high enough that each is allowed) against a one-row UPDATE of a 1,000-row table and a SELECT
// 1 round trip, on one server, and go-redis/redis_rate v10 (GCRA in a Lua script) on a local
// redis-server: serially, alternating (Serial), and from 16 goroutines at once for a fixed
// count each, one kind after the other (Parallel16). The limiter runs WithDurableDecisions, so
// that it commits as the UPDATE does (synchronously); BenchmarkFloorRateLimit measures both
// commit modes against their floors. Reports microseconds per call and, as
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
		r, err := ratelimit.New(pool, ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000}, ratelimit.WithDurableDecisions())
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
				d, err := run16(per, func(g int) func() error {
					rng := rand.New(rand.NewPCG(uint64(g), uint64(n)))
					return func() error { return op(rng) }
				})
				spent[i] += d
				if err != nil {
					b.Fatal(names[i], err)
				}
			}
			n += 16 * per
		}
		report(b, spent, n)
	})
}

// BenchmarkRateLimitHotKey: 16 goroutines on one key (a limit high enough that all are
// allowed; WithDurableDecisions, committed as the UPDATE is): every request of the key is decided under its row lock, one after the other.
// Reports microseconds per request (wall time / requests) for fencelock and redis_rate, and
// for 16 goroutines updating one row, the floor of any design that keeps a key's state in one
// row.
func BenchmarkRateLimitHotKey(b *testing.B) {
	e := benchSetup(b)
	rdb := startRedis(b)
	r, err := ratelimit.New(e.pool, ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000}, ratelimit.WithDurableDecisions())
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
			d, err := run16(per, func(int) func() error { return op })
			spent[i] += d
			if err != nil {
				b.Error(err)
			}
		}
		n += 16 * per
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	b.ReportMetric(us(spent[0]), "update-us")
	b.ReportMetric(us(spent[1]), "fencelock-us")
	b.ReportMetric(us(spent[2]), "redis_rate-us")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "update-x")
}
