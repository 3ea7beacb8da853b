package integration

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// The floor tables of issue 23: each benchmark runs its operations and their floors (the
// hand-written SQL a user would write instead, a peer library, a SELECT 1 round trip) in the
// same run, on the same server, in interleaved rounds, at 1 and at 16 clients, with fsync on
// (what users run) and off (what pgtest runs). It reports each row's throughput (median of
// the rounds), its latency (p50 and p99 over every call of every round), and the ratios the
// targets are stated in, both the median and the worst round.

// fsyncModes returns the fsync settings a floor benchmark runs under: both, unless
// FENCELOCK_BENCH_FSYNC is "on" or "off".
func fsyncModes() []bool {
	switch os.Getenv("FENCELOCK_BENCH_FSYNC") {
	case "on":
		return []bool{true}
	case "off":
		return []bool{false}
	}
	return []bool{true, false}
}

// withFsync runs f as a sub-benchmark "fsync=on" and "fsync=off" (fsyncModes), each on a
// dedicated server of its own.
func withFsync(b *testing.B, f func(b *testing.B, e *benchEnv), opts ...pgtest.Option) {
	for _, on := range fsyncModes() {
		name := "fsync=off"
		if on {
			name = "fsync=on"
		}
		b.Run(name, func(b *testing.B) { f(b, benchServer(b, on, opts...)) })
	}
}

// settingsFromEnv returns the server settings of FENCELOCK_BENCH_SETTINGS, "name=value" pairs
// separated by ";" (for a diagnosis: auto_explain with its log, say), after the benchmark's
// own, which they override. shared_preload_libraries set there replaces withStatementStats's.
func settingsFromEnv(b *testing.B) []pgtest.Option {
	var opts []pgtest.Option
	for _, kv := range strings.Split(os.Getenv("FENCELOCK_BENCH_SETTINGS"), ";") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			b.Fatalf("FENCELOCK_BENCH_SETTINGS: %q is not name=value", kv)
		}
		opts = append(opts, pgtest.WithSetting(strings.TrimSpace(name), strings.TrimSpace(value)))
	}
	return opts
}

// withStatementStats is the server options of serverTimes: pg_stat_statements loaded, and
// with FENCELOCK_BENCH_TRACK_ALL=1 also tracking the statements that functions run (the
// statements of fencelock.hand_off, say), which logStatements then lists.
func withStatementStats() []pgtest.Option {
	opts := []pgtest.Option{pgtest.WithSetting("shared_preload_libraries", "pg_stat_statements")}
	if os.Getenv("FENCELOCK_BENCH_TRACK_ALL") == "1" {
		opts = append(opts, pgtest.WithSetting("pg_stat_statements.track", "all"),
			pgtest.WithSetting("pg_stat_statements.track_planning", "on"))
	}
	return opts
}

// resetStatementStats creates pg_stat_statements in e's database (the server must run
// withStatementStats) and empties it, so that serverTimes counts what runs after.
func resetStatementStats(b *testing.B, e *benchEnv) {
	b.Helper()
	if _, err := e.pool.Exec(e.ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		b.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}
}

// serverTimes reports, for each label, the server's mean execution time of the statements
// whose text matches the label's LIKE pattern (pg_stat_statements, top-level statements; the
// functions they call included), in microseconds per call, as "srv-<label>-us": the server's
// share of a row's cost, which the client's throughput and CPU figures do not separate.
func serverTimes(b *testing.B, e *benchEnv, patterns map[string]string) {
	b.Helper()
	for label, like := range patterns {
		var calls int64
		var total float64
		if err := e.pool.QueryRow(e.ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8
			FROM pg_stat_statements WHERE query LIKE $1 AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, like).Scan(&calls, &total); err != nil {
			b.Fatal(err)
		}
		if calls == 0 {
			b.Fatalf("serverTimes: no statement matches %q", like)
		}
		b.ReportMetric(total*1000/float64(calls), "srv-"+label+"-us")
	}
}

// benchServer is benchSetup with fsync chosen by the caller: on, the WAL is flushed to disk at
// every synchronous commit (with full_page_writes, as in production).
func benchServer(b *testing.B, fsync bool, extra ...pgtest.Option) *benchEnv {
	b.Helper()
	var opts []pgtest.Option
	if fsync {
		opts = append(opts, pgtest.WithSetting("fsync", "on"), pgtest.WithSetting("full_page_writes", "on"))
	}
	opts = append(opts, extra...)
	opts = append(opts, settingsFromEnv(b)...)
	srv := pgtest.NewServer(b, opts...)
	db := srv.NewDB(b)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE bench (id int PRIMARY KEY, v bigint NOT NULL) WITH (fillfactor = 70);
		INSERT INTO bench SELECT g, 0 FROM generate_series(1, 1000) g`); err != nil {
		b.Fatal(err)
	}
	return &benchEnv{ctx: ctx, pool: db.Pool, url: db.URL}
}

// lessorGrantStatement and lessorReleaseStatement match (serverTimes) the statements of a
// Lessor's TryAcquire and of a Lease's Release.
const (
	lessorGrantStatement   = "%INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)%ON CONFLICT (name) DO UPDATE%RETURNING l.token, l.expires_at"
	lessorReleaseStatement = "%WITH released AS (%fencelock.hand_off(%"
)

// floorOp is one row of a floor table. newClient is called once per client goroutine (client
// is 0..clients-1) before any timing and returns that client's call of one operation.
type floorOp struct {
	name      string
	newClient func(client int) (func() error, error)
}

// controlRow is the name of a floor table's control row (floorTable).
const controlRow = "control"

// floorRow is what floorTable measured of one row.
type floorRow struct {
	name     string
	controls string          // the control row's: the name of the row it repeats
	perSec   []float64       // operations per second, one per round
	samples  []time.Duration // every call's latency, all rounds
	ops      int             // calls measured, all rounds
	cpu      time.Duration   // this process's CPU time (user + system) during the row's turns
}

// cpuPerOp is the client's CPU time per call, in microseconds: this process's CPU during the
// row's turns (its goroutines, the driver, the runtime, and anything else the process ran
// meanwhile, such as a lessor's heartbeat) over the calls.
func (r *floorRow) cpuPerOp() float64 {
	if r.ops == 0 {
		return 0
	}
	return float64(r.cpu.Nanoseconds()) / 1e3 / float64(r.ops)
}

// median is the row's median throughput over its rounds, in operations per second.
func (r *floorRow) median() float64 { return medianOf(r.perSec) }

// quantile is the latency below which q of the calls fell (q in [0, 1]).
func (r *floorRow) quantile(q float64) time.Duration {
	if len(r.samples) == 0 {
		return 0
	}
	s := slices.Clone(r.samples)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// floorRounds is the number of interleaved rounds of a floor table, and floorRound the length
// of one row's turn in a round; FENCELOCK_BENCH_ROUNDS and FENCELOCK_BENCH_ROUND override them.
func floorRounds() (int, time.Duration) {
	n, d := 3, time.Second
	if s := os.Getenv("FENCELOCK_BENCH_ROUNDS"); s != "" {
		fmt.Sscan(s, &n)
	}
	if s := os.Getenv("FENCELOCK_BENCH_ROUND"); s != "" {
		if v, err := time.ParseDuration(s); err == nil {
			d = v
		}
	}
	return n, d
}

// floorTable runs each op with clients goroutines, for floorRound per turn, the rows taking
// turns in each of floorRounds rounds (so a machine that slows down weighs on every row), after
// a warm-up of each. Calls of one turn run back to back; a failed call fails the benchmark.
// It ignores b.N: run floor benchmarks with -benchtime=1x.
//
// The table gets one more row, its control: ops[0] again under the name "control", with
// clients of its own, taking its turn last in each round. The same work measured twice in one
// run, it tells how far a ratio can move by noise on the machine it ran on: report gives
// control/<ops[0]> (median, worst and best round), and a ratio of two other rows that differs
// from 1 by less than the control's spread says nothing.
func floorTable(b *testing.B, clients int, ops []floorOp) []*floorRow {
	b.Helper()
	rounds, turn := floorRounds()
	ops = append(slices.Clip(ops), floorOp{controlRow, ops[0].newClient})
	calls := make([][]func() error, len(ops))
	for i, op := range ops {
		for c := range clients {
			f, err := op.newClient(c)
			if err != nil {
				b.Fatalf("%s: %v", op.name, err)
			}
			calls[i] = append(calls[i], f)
		}
	}
	rows := make([]*floorRow, len(ops))
	for i, op := range ops {
		rows[i] = &floorRow{name: op.name}
	}
	rows[len(rows)-1].controls = ops[0].name
	run := func(i int, d time.Duration, record bool) {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			count int
			errs  []error
		)
		start, cpu0 := time.Now(), processCPU(b)
		deadline := start.Add(d)
		for c := range clients {
			wg.Add(1)
			go func(f func() error) {
				defer wg.Done()
				var lat []time.Duration
				for time.Now().Before(deadline) {
					t0 := time.Now()
					if err := f(); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					lat = append(lat, time.Since(t0))
				}
				mu.Lock()
				count += len(lat)
				if record {
					rows[i].samples = append(rows[i].samples, lat...)
				}
				mu.Unlock()
			}(calls[i][c])
		}
		wg.Wait()
		if len(errs) > 0 {
			b.Fatalf("%s: %v", ops[i].name, errs[0])
		}
		if record {
			rows[i].perSec = append(rows[i].perSec, float64(count)/time.Since(start).Seconds())
			rows[i].ops += count
			rows[i].cpu += processCPU(b) - cpu0
		}
	}
	for i := range ops {
		run(i, turn/4, false)
	}
	for range rounds {
		for i := range ops {
			run(i, turn, true)
		}
	}
	return rows
}

// report reports each row's median throughput and latency quantiles, and for each pair
// (num, den) of row names the ratio of num's throughput to den's: the median over the rounds
// as "<num>/<den>" and the worst round as "<num>/<den>-min". It adds the control row's ratio to
// the row it repeats, with its best round too ("control/<row>-max").
func report(b *testing.B, rows []*floorRow, pairs ...[2]string) {
	b.Helper()
	byName := map[string]*floorRow{}
	for _, r := range rows {
		byName[r.name] = r
		b.ReportMetric(r.median(), r.name+"-ops/s")
		b.ReportMetric(float64(r.quantile(0.5).Nanoseconds())/1e3, r.name+"-p50-us")
		b.ReportMetric(float64(r.quantile(0.99).Nanoseconds())/1e3, r.name+"-p99-us")
		b.ReportMetric(r.cpuPerOp(), r.name+"-client-cpu-us")
	}
	for _, r := range rows {
		if r.controls != "" {
			pairs = append(pairs, [2]string{r.name, r.controls})
		}
	}
	for _, p := range pairs {
		num, den := byName[p[0]], byName[p[1]]
		if num == nil || den == nil {
			b.Fatalf("report: no row %q or %q", p[0], p[1])
		}
		worst, best := 0.0, 0.0
		for k := range min(len(num.perSec), len(den.perSec)) {
			r := num.perSec[k] / den.perSec[k]
			if k == 0 || r < worst {
				worst = r
			}
			if k == 0 || r > best {
				best = r
			}
		}
		b.ReportMetric(num.median()/den.median(), p[0]+"/"+p[1])
		b.ReportMetric(worst, p[0]+"/"+p[1]+"-min")
		if num.controls != "" {
			b.ReportMetric(best, p[0]+"/"+p[1]+"-max")
		}
	}
}

// clientCounts is the client counts of a floor table: 1 and 16, or FENCELOCK_BENCH_CLIENTS
// (a comma-separated list).
func clientCounts() []int {
	if s := os.Getenv("FENCELOCK_BENCH_CLIENTS"); s != "" {
		var out []int
		for _, f := range splitComma(s) {
			var n int
			if _, err := fmt.Sscan(f, &n); err == nil && n > 0 {
				out = append(out, n)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return []int{1, 16}
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

// withClients runs f as a sub-benchmark "clients=N" for each of clientCounts.
func withClients(b *testing.B, f func(b *testing.B, clients int)) {
	for _, n := range clientCounts() {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { f(b, n) })
	}
}

// sqlDBOf returns a lib/pq *sql.DB of at most conns connections (all kept idle) to e's
// database, closed at cleanup.
func (e *benchEnv) sqlDBOf(b *testing.B, conns int) *sql.DB {
	b.Helper()
	sqlDB, err := sql.Open("postgres", e.url)
	if err != nil {
		b.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(conns)
	sqlDB.SetMaxIdleConns(conns)
	b.Cleanup(func() { _ = sqlDB.Close() })
	return sqlDB
}

// leaseFloorOp is the floor-table call of an uncontended Lessor.TryAcquire + Lease.Release of
// l, TTL one minute, each client on a name of its own (prefix-client).
func leaseFloorOp(ctx context.Context, l *fencelock.Lessor, prefix string) func(int) (func() error, error) {
	return func(c int) (func() error, error) {
		return takeAndEnd(heldLease(ctx, l.TryAcquire, fmt.Sprintf("%s-%d", prefix, c), time.Minute)), nil
	}
}

// poolOf returns a new pool of at most conns connections to e's database, closed at cleanup:
// a floor table at 16 clients needs 16 sessions at once (the default pool has max(4, CPUs)).
func (e *benchEnv) poolOf(b *testing.B, conns int32) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}
