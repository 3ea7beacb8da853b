package integration

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// BenchmarkFloorAdvisory is issue 23's floor table of the advisory pair: a session lock taken
// and released by fencelock (AdvisoryLocker.TryLock, then AdvisoryLock.Unlock) beside the same
// pair written by hand with pgx (acquire a pool connection, SELECT pg_try_advisory_lock($1),
// SELECT pg_advisory_unlock($1), release the connection) and a SELECT 1 round trip. Each
// client locks a key of its own, of the shape fencelock uses (the int64 key its name maps to),
// so no call is refused. A fourth row, raw+label, is the raw pair that also names the lock in
// application_name and puts the previous name back, as fencelock does (each in the lock's and
// the unlock's one statement): fencelock/raw+label is fencelock's cost over the same work done
// by hand, raw+label/raw the label's. Every row shares one pool of clients+1 connections (the locker's
// default cap on session locks is then the client count) and one locker, as a service would.
// Target: fencelock/raw >= 0.95 in every round (fencelock/raw-min), at 1 and 16 clients.
func BenchmarkFloorAdvisory(b *testing.B) {
	withFsync(b, func(b *testing.B, e *benchEnv) {
		withClients(b, func(b *testing.B, clients int) {
			pool := e.poolOf(b, int32(clients)+1)
			a, err := fencelock.NewAdvisoryLocker(pool)
			if err != nil {
				b.Fatal(err)
			}
			rows := floorTable(b, clients, []floorOp{
				{"raw", func(c int) (func() error, error) {
					key, err := a.Key(benchAdvisoryName(c))
					if err != nil {
						return nil, err
					}
					k, _ := key.Int64()
					return func() error { return rawAdvisoryPair(e, pool, k) }, nil
				}},
				{"raw+label", func(c int) (func() error, error) {
					key, err := a.Key(benchAdvisoryName(c))
					if err != nil {
						return nil, err
					}
					k, _ := key.Int64()
					return func() error { return rawLabelledAdvisoryPair(e, pool, k, "fencelock "+benchAdvisoryName(c)) }, nil
				}},
				{"fencelock", func(c int) (func() error, error) {
					name := benchAdvisoryName(c)
					return func() error {
						lk, err := a.TryLock(e.ctx, name)
						if err != nil {
							return err
						}
						return lk.Unlock(e.ctx)
					}, nil
				}},
				{"select1", func(int) (func() error, error) {
					return func() error {
						var one int
						return pool.QueryRow(e.ctx, `SELECT 1`).Scan(&one)
					}, nil
				}},
			})
			report(b, rows, [2]string{"fencelock", "raw"}, [2]string{"fencelock", "raw+label"},
				[2]string{"raw+label", "raw"}, [2]string{"raw", "select1"})
		})
	})
}

// benchAdvisoryName is the lock name of client c in the advisory floor tables.
func benchAdvisoryName(c int) string { return fmt.Sprintf("bench-advisory-%d", c) }

// rawAdvisoryPair is the advisory pair a user writes by hand with pgx: a pool connection,
// pg_try_advisory_lock, pg_advisory_unlock, the connection back. A refused lock or an unlock
// that released nothing is an error, as the benchmark's keys are its client's own.
func rawAdvisoryPair(e *benchEnv, pool *pgxpool.Pool, key int64) error {
	conn, err := pool.Acquire(e.ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var ok bool
	if err := conn.QueryRow(e.ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw: key %d is held", key)
	}
	if err := conn.QueryRow(e.ctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw: key %d was not held at unlock", key)
	}
	return nil
}

// rawLabelledAdvisoryPair is rawAdvisoryPair that also sets application_name to label while
// the lock is held, and puts the previous one back, in the same two statements.
func rawLabelledAdvisoryPair(e *benchEnv, pool *pgxpool.Pool, key int64, label string) error {
	conn, err := pool.Acquire(e.ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	prev := conn.Conn().PgConn().ParameterStatus("application_name")
	var ok bool
	if err := conn.QueryRow(e.ctx, `SELECT pg_try_advisory_lock($1) AND set_config('application_name', $2, false) IS NOT NULL`, key, label).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw+label: key %d is held", key)
	}
	if err := conn.QueryRow(e.ctx, `SELECT pg_advisory_unlock($1) AND set_config('application_name', $2, false) IS NOT NULL`, key, prev).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw+label: key %d was not held at unlock", key)
	}
	return nil
}

// BenchmarkAdvisoryPairCost measures what one advisory pair costs, one client, pairs back to
// back, rather than how many pairs a loaded machine runs: the client's CPU time per pair
// (getrusage), the server's (the pool's backends' utime + stime from /proc, when the server
// runs on this machine), the wall time and the allocations per pair, for raw, raw+label and
// fencelock (as in BenchmarkFloorAdvisory), in interleaved rounds of 5,000 pairs. CPU time
// does not grow with the machine's load as throughput shrinks with it, so the ratios hold on a
// shared machine where the floor table's rounds do not. It reports each row's medians over
// the rounds, and each row's ratio to raw (the median of the rounds' ratios).
func BenchmarkAdvisoryPairCost(b *testing.B) {
	e := benchServer(b, false)
	pool := e.poolOf(b, 2)
	a, err := fencelock.NewAdvisoryLocker(pool)
	if err != nil {
		b.Fatal(err)
	}
	name := benchAdvisoryName(0)
	key, err := a.Key(name)
	if err != nil {
		b.Fatal(err)
	}
	k, _ := key.Int64()
	rows := []struct {
		name string
		pair func() error
	}{
		{"raw", func() error { return rawAdvisoryPair(e, pool, k) }},
		{"raw+label", func() error { return rawLabelledAdvisoryPair(e, pool, k, "fencelock "+name) }},
		{"fencelock", func() error {
			lk, err := a.TryLock(e.ctx, name)
			if err != nil {
				return err
			}
			return lk.Unlock(e.ctx)
		}},
	}
	const rounds, pairs = 8, 5000
	type cost struct{ wall, client, server, allocs []float64 }
	costs := make([]cost, len(rows))
	for round := range rounds + 1 { // round 0 warms up
		for i, r := range rows {
			var pids []int
			for _, c := range pool.AcquireAllIdle(e.ctx) {
				pids = append(pids, int(c.Conn().PgConn().PID()))
				c.Release()
			}
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			s0, c0, t0 := serverCPU(pids), clientCPU(b), time.Now()
			for range pairs {
				if err := r.pair(); err != nil {
					b.Fatalf("%s: %v", r.name, err)
				}
			}
			wall, c1, s1 := time.Since(t0), clientCPU(b), serverCPU(pids)
			runtime.ReadMemStats(&m1)
			if round == 0 {
				continue
			}
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / pairs }
			c := &costs[i]
			c.wall = append(c.wall, us(wall))
			c.client = append(c.client, us(c1-c0))
			c.server = append(c.server, us(s1-s0))
			c.allocs = append(c.allocs, float64(m1.Mallocs-m0.Mallocs)/pairs)
		}
	}
	local := medianOf(costs[0].server) > 0 // the server's processes could be read
	ratio := func(num, den []float64) float64 {
		var r []float64
		for j := range num {
			if den[j] > 0 {
				r = append(r, num[j]/den[j])
			}
		}
		return medianOf(r)
	}
	for i, r := range rows {
		c := costs[i]
		b.ReportMetric(medianOf(c.wall), r.name+"-wall-us")
		b.ReportMetric(medianOf(c.client), r.name+"-client-cpu-us")
		if local {
			b.ReportMetric(medianOf(c.server), r.name+"-server-cpu-us")
		}
		b.ReportMetric(medianOf(c.allocs), r.name+"-allocs")
		if i == 0 {
			continue
		}
		b.ReportMetric(ratio(c.wall, costs[0].wall), r.name+"/raw-wall")
		b.ReportMetric(ratio(c.client, costs[0].client), r.name+"/raw-client-cpu")
		if local {
			b.ReportMetric(ratio(c.server, costs[0].server), r.name+"/raw-server-cpu")
		}
	}
}

// clientCPU is this process's CPU time, user and system.
func clientCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the CPU time, user and system, of the server processes pids, read from
// /proc/<pid>/stat (in clock ticks, taken as 10 ms each); 0 for a pid it cannot read (a server
// in a container, or on another machine).
func serverCPU(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(raw)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from the 3rd (state) on
		var utime, stime int64
		if len(f) > 12 {
			fmt.Sscan(f[11], &utime) // field 14
			fmt.Sscan(f[12], &stime) // field 15
		}
		total += time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return total
}
