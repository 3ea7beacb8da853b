package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/db"
)

// Benchmarks at the scale users reach: renewal cost per lease at 1k, 10k and 100k leases in
// one statement, acquire and release cost (wall and client CPU) while the lessor holds 0 to
// 10,000 leases, and the sweep's rate and its effect on concurrent grants. Each reports
// ratios to a one-row autocommit UPDATE measured in the same run on the same server.

// floorUs times the one-row UPDATE floor, in microseconds per call.
func floorUs(b *testing.B, e *benchEnv) float64 {
	b.Helper()
	update := e.update(1)
	for range 200 {
		if err := update(); err != nil {
			b.Fatal(err)
		}
	}
	t0 := time.Now()
	for range 1000 {
		if err := update(); err != nil {
			b.Fatal(err)
		}
	}
	return float64(time.Since(t0).Microseconds()) / 1000
}

// insertLeases inserts n lease rows of holder, held for an hour, named prefix:1..n, and
// returns their names and tokens.
func insertLeases(b *testing.B, e *benchEnv, holder, prefix string, n int, expired bool) ([]string, []int64) {
	b.Helper()
	expiry := "now() + interval '1 hour'"
	if expired {
		expiry = "now() - interval '2 hours'"
	}
	rows, err := e.pool.Query(e.ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
		SELECT $1 || ':' || i, $2, now(), `+expiry+` FROM generate_series(1, $3) AS i RETURNING name, token`, prefix, holder, n)
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	var tokens []int64
	for rows.Next() {
		var name string
		var token int64
		if err := rows.Scan(&name, &token); err != nil {
			b.Fatal(err)
		}
		names, tokens = append(names, name), append(tokens, token)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return names, tokens
}

// BenchmarkRenewBatch: one renewal statement for n leases (the heartbeat sends at most 1,000
// per statement; this measures the statement's own scaling, and at 100 leases, about what a
// statement carried before the renewal window, its fixed cost). Reports us-per-lease and its
// ratio to a one-row UPDATE: constant across n when renewal is linear.
func BenchmarkRenewBatch(b *testing.B) {
	for _, n := range []int{100, 1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			e := benchSetup(b)
			names, tokens := insertLeases(b, e, "h", "lease", n, false)
			ttls := make([]int64, n)
			for i := range ttls {
				ttls[i] = time.Hour.Microseconds()
			}
			floor := floorUs(b, e)
			sql := db.Statement("LeaseRenew")
			var total time.Duration
			var loops int
			for b.Loop() {
				t0 := time.Now()
				tag, err := e.pool.Exec(e.ctx, sql, names, tokens, ttls, "h")
				if err != nil {
					b.Fatal(err)
				}
				if tag.RowsAffected() != int64(n) {
					b.Fatalf("renewed %d of %d", tag.RowsAffected(), n)
				}
				total += time.Since(t0)
				loops++
			}
			perLease := float64(total.Microseconds()) / float64(loops) / float64(n)
			b.ReportMetric(perLease, "us/lease")
			b.ReportMetric(floor, "floor-us")
			b.ReportMetric(perLease/floor, "x-update/lease")
		})
	}
}

// BenchmarkAcquireReleaseWhileHolding: TryAcquire + Release of one name while the same lessor
// holds held other leases (TTL 1 h, heartbeat on). Reports wall time and client CPU per
// pair, and the wall time's ratio to two one-row UPDATEs: the same at every held count when
// acquire and release cost does not depend on it.
func BenchmarkAcquireReleaseWhileHolding(b *testing.B) {
	for _, held := range []int{0, 1000, 10_000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			e := benchSetup(b)
			l := benchLessor(b, e.pool)
			var leases []*fencelock.Lease
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Go(func() {
					for i := w; i < held; i += 8 {
						lease, err := l.TryAcquire(e.ctx, fmt.Sprintf("held:%d", i), time.Hour)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						leases = append(leases, lease)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			floor := floorUs(b, e)
			op := func() error {
				lease, err := l.TryAcquire(e.ctx, "bench", time.Hour)
				if err != nil {
					return err
				}
				return lease.Release(e.ctx)
			}
			for range 200 {
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			var wall, cpu time.Duration
			var loops int
			for b.Loop() {
				c0, t0 := processCPU(b), time.Now()
				if err := op(); err != nil {
					b.Fatal(err)
				}
				wall += time.Since(t0)
				cpu += processCPU(b) - c0
				loops++
			}
			b.ReportMetric(float64(wall.Microseconds())/float64(loops), "op-us")
			b.ReportMetric(float64(cpu.Microseconds())/float64(loops), "client-cpu-us")
			b.ReportMetric(float64(wall.Microseconds())/float64(loops)/(2*floor), "x-2updates")
			for _, lease := range leases {
				if lease.Err() != nil {
					b.Fatalf("held lease %s lost: %v", lease.Name(), lease.Err())
				}
				_ = lease.Release(e.ctx)
			}
		})
	}
}

// BenchmarkSweep: SweepLeases over 100,000 expired rows (and 1,000 held ones), while one
// goroutine grants and releases names, swept ones included. Reports rows deleted per second
// and the concurrent grant+release latency (p50, p99) during the sweep and, measured just
// before in the same run, without it.
func BenchmarkSweep(b *testing.B) {
	e := benchSetup(b)
	insertLeases(b, e, "live", "live", 1000, false)
	l := benchLessor(b, e.pool)
	var refused int // grants refused: a name whose row the sweep held locked past lock_timeout
	prefix := ""
	grants := func(ctx context.Context, i *int) (lat []time.Duration) {
		for ctx.Err() == nil {
			*i++
			t0 := time.Now()
			lease, err := l.TryAcquire(e.ctx, fmt.Sprintf("%s:%d", prefix, 1+(*i*7919)%100_000), time.Minute)
			if errors.Is(err, fencelock.ErrNotAcquired) {
				refused++
				continue
			}
			if err != nil {
				b.Error(err)
				return lat
			}
			if err := lease.Release(e.ctx); err != nil {
				b.Error(err)
				return lat
			}
			lat = append(lat, time.Since(t0))
		}
		return lat
	}
	pct := func(lat []time.Duration, p float64) float64 {
		slices.Sort(lat)
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds())
	}
	var rows int64
	var sweepTime time.Duration
	var during, before []time.Duration
	i := 0
	for round := 0; b.Loop(); round++ {
		prefix = fmt.Sprintf("old%d", round) // rows re-granted in a round stay (inside the grace)
		insertLeases(b, e, "h", prefix, 100_000, true)
		ctx, stop := context.WithTimeout(e.ctx, 500*time.Millisecond)
		before = append(before, grants(ctx, &i)...)
		stop()
		ctx, stop = context.WithCancel(e.ctx)
		latCh := make(chan []time.Duration)
		go func() { latCh <- grants(ctx, &i) }()
		t0 := time.Now()
		n, err := fencelock.SweepLeases(e.ctx, e.pool, time.Minute)
		sweepTime += time.Since(t0)
		stop()
		during = append(during, <-latCh...)
		if err != nil {
			b.Fatal(err)
		}
		rows += n
	}
	b.ReportMetric(float64(rows)/sweepTime.Seconds(), "rows/s")
	b.ReportMetric(pct(before, 0.5), "grant-p50-us-idle")
	b.ReportMetric(pct(before, 0.99), "grant-p99-us-idle")
	b.ReportMetric(pct(during, 0.5), "grant-p50-us-sweep")
	b.ReportMetric(pct(during, 0.99), "grant-p99-us-sweep")
	b.ReportMetric(pct(during, 1), "grant-max-us-sweep")
	b.ReportMetric(float64(len(during)), "grants-during-sweep")
	b.ReportMetric(float64(refused), "grants-refused")
}

// BenchmarkHoldersView: SELECT * FROM fencelock.holders (what `fencelock locks` reads) with
// 10,000 held leases, 1,000 of them with 4 live waiters each, beside a one-row UPDATE:
// what one refresh of `fencelock watch` costs the server at the scale users reach.
func BenchmarkHoldersView(b *testing.B) {
	e := benchSetup(b)
	const n = 10_000
	insertLeases(b, e, "h", "lease", n, false)
	if _, err := e.pool.Exec(e.ctx, `INSERT INTO fencelock.lease_waiters (name, holder, wait_id, seq, ttl_us, since, expires_at)
		SELECT 'lease:' || i, 'w' || w, 1, nextval('fencelock.lease_waiters_seq'), 60000000, now(), now() + interval '1 hour'
		FROM generate_series(1, 1000) AS i, generate_series(1, 4) AS w`); err != nil {
		b.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `ANALYZE fencelock.leases; ANALYZE fencelock.lease_waiters`); err != nil {
		b.Fatal(err)
	}
	floor := floorUs(b, e)
	var total time.Duration
	var loops int
	for b.Loop() {
		t0 := time.Now()
		rows, err := e.pool.Query(e.ctx, `SELECT name, holder, token, ttl_left, renewals, heartbeat, waiters, next_holder FROM fencelock.holders`)
		if err != nil {
			b.Fatal(err)
		}
		var got, waited int
		for rows.Next() {
			var name, holder, heartbeat string
			var token, renewals, waiters int64
			var left time.Duration
			var next *string
			if err := rows.Scan(&name, &holder, &token, &left, &renewals, &heartbeat, &waiters, &next); err != nil {
				b.Fatal(err)
			}
			got++
			if waiters > 0 {
				waited++
			}
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		if got != n || waited != 1000 {
			b.Fatalf("holders: %d rows, %d with waiters; want %d and 1000", got, waited, n)
		}
		total += time.Since(t0)
		loops++
	}
	ms := float64(total.Microseconds()) / float64(loops) / 1000
	b.ReportMetric(ms, "ms/read")
	b.ReportMetric(ms*1000/float64(n), "us/lease")
	b.ReportMetric(ms*1000/floor, "x-update")
}
