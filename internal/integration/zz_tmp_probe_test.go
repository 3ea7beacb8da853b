package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/ratelimit"
)

func BenchmarkTmpProbe(b *testing.B) {
	e := benchSetup(b)
	if _, err := e.pool.Exec(e.ctx, `CREATE TABLE bench_rl (id int PRIMARY KEY, v bigint NOT NULL) WITH (fillfactor = 70);
			INSERT INTO bench_rl SELECT g, 0 FROM generate_series(0, 999) g`); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1000)
	lim := ratelimit.Limit{Rate: 1_000_000, Per: time.Second, Burst: 1000}
	warm, _ := ratelimit.New(e.pool, lim)
	for i := range keys {
		keys[i] = "c0:key:" + strconv.Itoa(i)
		warm.Allow(e.ctx, keys[i])
	}
	iv := func(us int64) pgtype.Interval { return pgtype.Interval{Microseconds: us, Valid: true} }
	sub := `(SELECT CASE WHEN d.base + $3::interval <= d.t THEN d.base + $2::interval ELSE r.tat END,
           d.base + $3::interval <= d.t, d.t
    FROM (SELECT x.t, greatest(r.tat, x.t) AS base FROM (SELECT clock_timestamp() AS t) AS x) AS d)`
	cfgCase := `(SELECT set_config('synchronous_commit',
                        CASE WHEN NOT $4::boolean THEN 'off'
                             WHEN current_setting('synchronous_commit') = 'off' THEN 'on'
                             ELSE current_setting('synchronous_commit') END, true) AS sync_commit) AS cfg`
	innerSQL := `UPDATE fencelock.rate_limits AS r SET (tat, allowed, decided_at) = (SELECT CASE WHEN d.base + $3::interval <= d.t THEN d.base + $2::interval ELSE r.tat END,
           d.base + $3::interval <= d.t, d.t
    FROM (SELECT x.t, greatest(r.tat, x.t) AS base FROM (SELECT clock_timestamp() AS t, set_config('synchronous_commit',
                        CASE WHEN NOT $4::boolean THEN 'off'
                             WHEN current_setting('synchronous_commit') = 'off' THEN 'on'
                             ELSE current_setting('synchronous_commit') END, true) AS sync_commit) AS x) AS d) WHERE r.key = $1::text RETURNING r.tat, r.allowed, r.decided_at AS at`
	rows, err := e.pool.Query(e.ctx, "EXPLAIN (VERBOSE, COSTS OFF) "+innerSQL, keys[0], iv(1), iv(-999), false)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var l string
		rows.Scan(&l)
		fmt.Println(l)
	}
	rows.Close()
	rows, err = e.pool.Query(e.ctx, "EXPLAIN (VERBOSE, COSTS OFF) "+`UPDATE fencelock.rate_limits AS r SET (tat, allowed, decided_at) = `+sub+` FROM `+cfgCase+` WHERE r.key = $1::text RETURNING r.tat, r.allowed, r.decided_at AS at`, keys[0], iv(1), iv(-999), false)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var l string
		rows.Scan(&l)
		fmt.Println(l)
	}
	rows.Close()
	type v struct {
		name string
		f    func(p *pgxpool.Pool, rng *rand.Rand) error
	}
	var rl *ratelimit.Limiter
	vs := []v{
		{"select1", func(p *pgxpool.Pool, rng *rand.Rand) error {
			var one int
			return p.QueryRow(e.ctx, `SELECT 1`).Scan(&one)
		}},
		{"update-int", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := p.Exec(e.ctx, `UPDATE bench_rl SET v = v + 1 FROM (SELECT set_config('synchronous_commit', 'off', true)) AS cfg WHERE id = $1`, rng.IntN(1000))
			return err
		}},
		{"update-text", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := p.Exec(e.ctx, `UPDATE fencelock.rate_limits SET allowed = NOT allowed FROM (SELECT set_config('synchronous_commit', 'off', true)) AS cfg WHERE key = $1`, keys[rng.IntN(1000)])
			return err
		}},
		{"allow-sql-exec", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := p.Exec(e.ctx, `UPDATE fencelock.rate_limits AS r SET (tat, allowed, decided_at) = `+sub+` FROM `+cfgCase+` WHERE r.key = $1::text RETURNING r.tat, r.allowed, r.decided_at AS at`, keys[rng.IntN(1000)], iv(1), iv(-999), false)
			return err
		}},
		{"allow-cfg-inner", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := p.Exec(e.ctx, innerSQL, keys[rng.IntN(1000)], iv(1), iv(-999), false)
			return err
		}},
		{"allow-sql-const-cfg", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := p.Exec(e.ctx, `UPDATE fencelock.rate_limits AS r SET (tat, allowed, decided_at) = `+sub+` FROM (SELECT set_config('synchronous_commit', 'off', true)) AS cfg WHERE r.key = $1::text RETURNING r.tat, r.allowed, r.decided_at AS at`, keys[rng.IntN(1000)], iv(1), iv(-999))
			return err
		}},
		{"allow-noreturning", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := p.Exec(e.ctx, `UPDATE fencelock.rate_limits AS r SET (tat, allowed, decided_at) = `+sub+` FROM `+cfgCase+` WHERE r.key = $1::text`, keys[rng.IntN(1000)], iv(1), iv(-999), false)
			return err
		}},
		{"allow-nosubplan", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := p.Exec(e.ctx, `UPDATE fencelock.rate_limits AS r SET tat = greatest(r.tat, x.t) + $2::interval, allowed = true, decided_at = x.t FROM (SELECT clock_timestamp() AS t, set_config('synchronous_commit', 'off', true)) AS x WHERE r.key = $1::text RETURNING r.tat, r.allowed, r.decided_at AS at`, keys[rng.IntN(1000)], iv(1))
			return err
		}},
		{"Allow", func(p *pgxpool.Pool, rng *rand.Rand) error {
			_, err := rl.Allow(e.ctx, keys[rng.IntN(1000)])
			return err
		}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pools := make([]*pgxpool.Pool, len(vs))
	pids := make([]int, len(vs))
	for i := range vs {
		pools[i] = e.poolOf(b, 1)
		if err := pools[i].QueryRow(e.ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			b.Fatal(err)
		}
		if vs[i].name == "Allow" {
			rl, _ = ratelimit.New(pools[i], lim)
		}
	}
	sched := func(pid int) int64 {
		d, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			b.Fatal(err)
		}
		var ns int64
		fmt.Sscan(string(d), &ns)
		return ns
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for i, x := range vs {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range 2000 {
			x.f(pools[i], rng)
		}
		runtime.ReadMemStats(&m1)
		fmt.Printf("%-22s allocs/op %5.1f bytes/op %6.0f\n", x.name, float64(m1.Mallocs-m0.Mallocs)/2000, float64(m1.TotalAlloc-m0.TotalAlloc)/2000)
	}
	srv := make([]int64, len(vs))
	cli := make([]time.Duration, len(vs))
	wall := make([]time.Duration, len(vs))
	n := 0
	for round := range 12 {
		for i, x := range vs {
			s0, c0, t0 := sched(pids[i]), cpu(), time.Now()
			for range 1000 {
				if err := x.f(pools[i], rng); err != nil {
					b.Fatal(err)
				}
			}
			if round >= 2 {
				srv[i] += sched(pids[i]) - s0
				cli[i] += cpu() - c0
				wall[i] += time.Since(t0)
			}
		}
		if round >= 2 {
			n += 1000
		}
	}
	for i, x := range vs {
		fmt.Printf("%-22s wall %6.1f us  server-cpu %6.1f us  client-cpu %6.1f us\n", x.name,
			float64(wall[i].Nanoseconds())/1e3/float64(n), float64(srv[i])/1e3/float64(n), float64(cli[i].Nanoseconds())/1e3/float64(n))
	}
}
