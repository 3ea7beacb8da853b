package integration

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// The renewal target of issue 23: a lessor holding 10,000 leases renews them, at steady state,
// in few large statements (at least 500 leases a statement on average), at a client CPU of at
// most 2 us per held lease per second, and a lessor holding 100,000 loses none.

// renewalTTLs returns the TTLs BenchmarkRenewalSteadyState runs at: 30 s, or
// FENCELOCK_BENCH_RENEWAL_TTL (a comma-separated list of durations).
func renewalTTLs() []time.Duration {
	var out []time.Duration
	for _, f := range splitComma(os.Getenv("FENCELOCK_BENCH_RENEWAL_TTL")) {
		if d, err := time.ParseDuration(f); err == nil && d > 0 {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return []time.Duration{30 * time.Second}
	}
	return out
}

// withFsyncStats is withFsync on servers that load pg_stat_statements, which counts the
// renewal statements, their rows and their server time.
func withFsyncStats(b *testing.B, f func(b *testing.B, e *benchEnv)) {
	for _, on := range fsyncModes() {
		name := "fsync=off"
		if on {
			name = "fsync=on"
		}
		b.Run(name, func(b *testing.B) {
			e := benchServer(b, on, pgtest.WithSetting("shared_preload_libraries", "pg_stat_statements"),
				pgtest.WithSetting("pg_stat_statements.track", "all"))
			if _, err := e.pool.Exec(e.ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
				b.Fatal(err)
			}
			f(b, e)
		})
	}
}

// renewalStats is what pg_stat_statements counted of the renewal statement (LeaseRenew)
// since its last reset: statements, rows returned (one per lease renewed), server time.
type renewalStats struct {
	calls, rows int64
	execMs      float64
}

func readRenewalStats(b *testing.B, e *benchEnv) renewalStats {
	b.Helper()
	var s renewalStats
	if err := e.pool.QueryRow(e.ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint,
		coalesce(sum(total_exec_time), 0)::float8
		FROM pg_stat_statements WHERE query LIKE '%renewed AS (%' AND query NOT LIKE '%pg_stat_statements%'`).Scan(&s.calls, &s.rows, &s.execMs); err != nil {
		b.Fatal(err)
	}
	return s
}

// holdLeases grants n leases of TTL ttl named prefix:0..n-1 to l, from 16 goroutines.
func holdLeases(b *testing.B, ctx context.Context, l *fencelock.Lessor, prefix string, n int, ttl time.Duration) []*fencelock.Lease {
	b.Helper()
	leases := make([]*fencelock.Lease, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				lease, err := l.TryAcquire(ctx, fmt.Sprintf("%s:%d", prefix, i), ttl)
				if err != nil {
					b.Error(err)
					return
				}
				leases[i] = lease
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return leases
}

// releaseLeases releases leases from 16 goroutines.
func releaseLeases(b *testing.B, ctx context.Context, leases []*fencelock.Lease) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(leases); i = int(next.Add(1)) - 1 {
				_ = leases[i].Release(ctx)
			}
		})
	}
	wg.Wait()
}

// BenchmarkRenewalSteadyState: one lessor holds n leases (10,000; 100,000 too with
// FENCELOCK_SCALE=1) of TTL 30 s (default heartbeat 10 s, safety margin 3 s; other TTLs with
// FENCELOCK_BENCH_RENEWAL_TTL), granted from 16 goroutines; after two heartbeats (steady
// state) it measures three heartbeats of renewals: the renewal statements per heartbeat
// interval, the leases per statement (avg), the server time per statement
// (pg_stat_statements), the client CPU per held lease per second (getrusage over the interval
// less the same process's idle CPU, measured before the grants over a few seconds), the heap
// allocations per lease renewed, and the goroutines; then, for one more heartbeat, the latency
// of TryAcquire + Release of another name by the same lessor (probe-*). It fails if any lease
// is lost. Run with -benchtime=1x; each sub-benchmark takes about 6.5 heartbeats plus the
// grants.
func BenchmarkRenewalSteadyState(b *testing.B) {
	counts := []int{10_000}
	if os.Getenv(scaleEnv) != "" {
		counts = append(counts, 100_000)
	}
	withFsyncStats(b, func(b *testing.B, e *benchEnv) {
		for _, n := range counts {
			for _, ttl := range renewalTTLs() {
				b.Run(fmt.Sprintf("leases=%d/ttl=%v", n, ttl), func(b *testing.B) {
					for b.Loop() {
						renewalSteadyState(b, e, n, ttl)
					}
				})
			}
		}
	})
}

func renewalSteadyState(b *testing.B, e *benchEnv, n int, ttl time.Duration) {
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Minute)
	defer cancel()
	pool := e.poolOf(b, 16)
	l, err := fencelock.NewLessor(pool, fencelock.WithHolder("renewal-bench"))
	if err != nil {
		b.Fatal(err)
	}
	hb := ttl / 3 // the default heartbeat
	// The process's idle CPU (pool, runtime), before anything is held.
	const idleFor = 3 * time.Second
	idle0 := processCPU(b)
	time.Sleep(idleFor) // measuring an interval, not awaiting an event
	idleRate := float64(processCPU(b)-idle0) / float64(idleFor)

	t0 := time.Now()
	leases := holdLeases(b, ctx, l, fmt.Sprintf("r%d", n), n, ttl)
	grant := time.Since(t0)
	defer releaseLeases(b, e.ctx, leases)

	time.Sleep(2 * hb) // to steady state: the grants' renewals merge into cohorts
	interval := 3 * hb
	if _, err := e.pool.Exec(e.ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0, start := processCPU(b), time.Now()
	maxG := runtime.NumGoroutine()
	for time.Since(start) < interval { // sampling the goroutine count, not awaiting an event
		time.Sleep(100 * time.Millisecond)
		maxG = max(maxG, runtime.NumGoroutine())
	}
	cpu, held := processCPU(b)-cpu0, time.Since(start)
	runtime.ReadMemStats(&ms1)
	s := readRenewalStats(b, e)

	// The probe: TryAcquire + Release of a name outside the held set, back to back, for one
	// heartbeat after the interval (not in its CPU): what the renewals cost the lessor's other
	// calls (its mutex, the pool), at the latency's tail.
	var probe []time.Duration
	for t1 := time.Now(); time.Since(t1) < hb; {
		p0 := time.Now()
		lease, err := l.TryAcquire(ctx, "probe", ttl)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		probe = append(probe, time.Since(p0))
	}
	slices.Sort(probe)

	lost := 0
	for _, lease := range leases {
		if lease.Err() != nil {
			if lost == 0 {
				b.Errorf("lease %s lost: %v", lease.Name(), lease.Err())
			}
			lost++
		}
	}
	if lost > 0 {
		b.Fatalf("%d of %d leases lost", lost, n)
	}
	if s.calls == 0 {
		b.Fatal("no renewal statement in the interval")
	}
	netCPU := float64(cpu) - idleRate*float64(held)
	b.ReportMetric(float64(n)/grant.Seconds(), "grants/s")
	b.ReportMetric(float64(s.calls)/(float64(held)/float64(hb)), "stmts/heartbeat")
	b.ReportMetric(float64(s.rows)/float64(s.calls), "leases/stmt")
	b.ReportMetric(float64(s.rows)/float64(n)/(float64(held)/float64(hb)), "renewals/lease/heartbeat")
	b.ReportMetric(s.execMs/float64(s.calls), "server-ms/stmt")
	b.ReportMetric(netCPU/1e3/float64(n)/held.Seconds(), "client-cpu-us/lease/s")
	b.ReportMetric(float64(cpu)/1e6/held.Seconds(), "client-cpu-ms/s")
	b.ReportMetric(idleRate*1e3, "idle-cpu-ms/s")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(max(s.rows, 1)), "allocs/renewal")
	b.ReportMetric(float64(maxG), "max-goroutines")
	b.ReportMetric(float64(probe[len(probe)/2].Microseconds()), "probe-p50-us")
	b.ReportMetric(float64(probe[len(probe)*99/100].Microseconds()), "probe-p99-us")
	b.ReportMetric(float64(probe[len(probe)-1].Microseconds()), "probe-max-us")
	b.Logf("%d leases, TTL %v: %d statements, %d rows in %v (%s)", n, ttl, s.calls, s.rows, held.Round(time.Millisecond),
		strings.TrimSpace(fmt.Sprintf("server %.1f ms", s.execMs)))
}
