package integration

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// The capacity figures of docs/CAPACITY.md (issue 24): how many grants one server gives, side
// by side with what the same server does of pgbench's built-in simple-update (the physical
// floor of durable one-transaction writes: group commit), and the ceiling of one hot name.

// capacityClients is the client counts of BenchmarkCapacity/DistinctNames: 1, 4, 16, 64 and
// 256, or FENCELOCK_BENCH_CLIENTS. pgtest's servers allow 300 connections; the fencelock row's
// pool has clients+4 and is closed before pgbench runs.
func capacityClients() []int {
	if os.Getenv("FENCELOCK_BENCH_CLIENTS") != "" {
		return clientCounts()
	}
	return []int{1, 4, 16, 64, 256}
}

// BenchmarkCapacity measures one server's capacity, fsync on and off (withFsync):
//
//   - DistinctNames/clients=N: rows "fencelock" (Lessor.TryAcquire + Lease.Release, one Lessor
//     shared by the clients, each client on a name of its own, TTL one minute) and "pgbench"
//     (the real pgbench binary, `pgbench -b simple-update -c N -j 2 -T <turn> -M prepared -n`,
//     after `pgbench -i -s 10` into the same database: its reported tps, and latencies from its
//     per-transaction log). The rows take turns in floorRounds rounds (the order alternating
//     from one round to the next); a fencelock turn is a floorTable of one round on a fresh
//     pool, closed before pgbench connects. Besides report's figures, each row reports the
//     whole machine's CPU use during its turns (cpu-busy, 1 = every core busy: the other
//     processes of the machine included), the server's commits per WAL write and per WAL
//     flush (pg_stat_wal.wal_write, wal_sync: the group-commit factor), and the WAL flushes
//     per second.
//   - HotName/{Lease,Advisory}/waiters=N: N waiters (16, 64), each a Lessor (or an
//     AdvisoryLocker) of one pool, loop on one name: wait for it, release it at once, and
//     wait again. It reports hand-offs per second over floorRounds x floorRound after a
//     warm-up, the hand-off's latency (start of a release to the next grant's return), the
//     machine's CPU use, and the floor of one hand-off (notifyFloor: a durable UPDATE that
//     NOTIFYs, received by a listening session) measured on the same server before. Each run
//     starts with a VACUUM of the queue and the leases, so that no run inherits the dead row
//     versions of the one before.
//
// It ignores b.N: run with -benchtime=1x. pgbench is looked for beside initdb (pgtest's
// binaries), else on PATH.
func BenchmarkCapacity(b *testing.B) {
	b.Run("DistinctNames", func(b *testing.B) {
		withFsync(b, capacityDistinctNames)
	})
	b.Run("HotName", func(b *testing.B) {
		withFsync(b, func(b *testing.B, e *benchEnv) {
			floor := notifyFloor(b, e, 200)
			for _, mech := range []string{"Lease", "Advisory"} {
				for _, waiters := range []int{16, 64} {
					b.Run(fmt.Sprintf("%s/waiters=%d", mech, waiters), func(b *testing.B) {
						// Each run starts from the same state: without it, the second run
						// inherits the dead row versions the first left in the queue and the
						// leases (no autovacuum within seconds), which made 64 waiters look
						// slower than 16 (issue 31).
						if _, err := e.pool.Exec(e.ctx, `VACUUM (ANALYZE) fencelock.lease_waiters, fencelock.leases`); err != nil {
							b.Fatal(err)
						}
						capacityHotName(b, e, mech, waiters, floor)
					})
				}
			}
		})
	})
}

// pgbenchPath returns the pgbench beside the initdb that pgtest runs, else pgbench on PATH.
func pgbenchPath(b *testing.B) string {
	b.Helper()
	if bins, err := pgserver.FindBinaries(); err == nil {
		if p := filepath.Join(bins.Dir, "pgbench"); pgserver.IsExecutable(p) {
			return p
		}
	}
	p, err := exec.LookPath("pgbench")
	if err != nil {
		b.Fatal("pgbench not found beside initdb nor on PATH")
	}
	return p
}

func capacityDistinctNames(b *testing.B, e *benchEnv) {
	pgbench := pgbenchPath(b)
	if out, err := exec.Command(pgbench, "-i", "-s", "10", "-q", e.url).CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	if _, err := e.pool.Exec(e.ctx, `CHECKPOINT`); err != nil {
		b.Fatal(err)
	}
	for _, clients := range capacityClients() {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			rounds, turn := floorRounds()
			secs := max(1, int(math.Ceil(turn.Seconds()))) // pgbench -T takes whole seconds
			turn = time.Duration(secs) * time.Second
			// Each fencelock turn is a floorTable of one round of the same length.
			b.Setenv("FENCELOCK_BENCH_ROUNDS", "1")
			b.Setenv("FENCELOCK_BENCH_ROUND", turn.String())
			fl := &capRow{floorRow: floorRow{name: "fencelock"}}
			pg := &capRow{floorRow: floorRow{name: "pgbench"}}
			b.Logf("load before: %s", loadAvg())
			for r := range rounds {
				turns := []func(){func() { capacityFencelockTurn(b, e, clients, fl) }, func() { capacityPgbenchTurn(b, e, pgbench, clients, secs, pg) }}
				if r%2 == 1 {
					turns[0], turns[1] = turns[1], turns[0]
				}
				for _, t := range turns {
					t()
				}
			}
			b.Logf("load after: %s", loadAvg())
			report(b, []*floorRow{&fl.floorRow, &pg.floorRow}, [2]string{"fencelock", "pgbench"})
			fl.reportServer(b)
			pg.reportServer(b)
		})
	}
}

// capRow is a floorRow with what the server and the machine did during the row's turns.
type capRow struct {
	floorRow
	wall             time.Duration // the turns' length, from the first counter read to the last
	busy, total      int64         // the machine's busy and total CPU ticks (/proc/stat)
	commits          int64         // pg_stat_database.xact_commit of the database
	walWrite, walSyn int64         // pg_stat_wal.wal_write, wal_sync
}

func (r *capRow) add(c0, c1 capCounters) {
	r.wall += c1.at.Sub(c0.at)
	r.busy += c1.busy - c0.busy
	r.total += c1.total - c0.total
	r.commits += c1.commits - c0.commits
	r.walWrite += c1.walWrite - c0.walWrite
	r.walSyn += c1.walSync - c0.walSync
}

func (r *capRow) reportServer(b *testing.B) {
	b.Helper()
	if r.total > 0 {
		b.ReportMetric(float64(r.busy)/float64(r.total), r.name+"-cpu-busy")
	}
	if r.walWrite > 0 {
		b.ReportMetric(float64(r.commits)/float64(r.walWrite), r.name+"-commits/wal-write")
	}
	if r.walSyn > 0 {
		b.ReportMetric(float64(r.commits)/float64(r.walSyn), r.name+"-commits/wal-sync")
		b.ReportMetric(float64(r.walSyn)/r.wall.Seconds(), r.name+"-wal-syncs/s")
	}
}

// capCounters is a reading of the server's and the machine's counters.
type capCounters struct {
	at                         time.Time
	busy, total                int64
	commits, walWrite, walSync int64
}

// readCapCounters reads the counters once no session named app is left in the database: a
// backend flushes its statistics at exit, so none of theirs is left pending.
func readCapCounters(b *testing.B, e *benchEnv, app string) capCounters {
	b.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	for {
		var left int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			b.Fatalf("the sessions of %s did not exit: %v", app, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	var c capCounters
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		wal_write, wal_sync FROM pg_stat_wal`).Scan(&c.commits, &c.walWrite, &c.walSync); err != nil {
		b.Fatal(err)
	}
	c.busy, c.total = machineCPU(b)
	c.at = time.Now()
	return c
}

// machineCPU returns the machine's busy and total CPU ticks, all cores (/proc/stat: busy is
// all but idle and iowait).
func machineCPU(b *testing.B) (busy, total int64) {
	b.Helper()
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0 // not Linux: no figure
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	for i, f := range fields[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q", line)
		}
		if i >= 8 { // guest and guest_nice are counted in user and nice already
			break
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// loadAvg returns the machine's load averages (/proc/loadavg), for the log.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// capacityFencelockTurn runs one turn of the fencelock row on a pool of its own, closed after.
func capacityFencelockTurn(b *testing.B, e *benchEnv, clients int, row *capRow) {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(clients) + 4
	cfg.ConnConfig.RuntimeParams["application_name"] = "capacity"
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	l, err := fencelock.NewLessor(pool)
	if err != nil {
		b.Fatal(err)
	}
	c0 := readCapCounters(b, e, "capacity")
	rows := floorTable(b, clients, []floorOp{{"fencelock", func(c int) (func() error, error) {
		name := fmt.Sprintf("cap-%d", c)
		return func() error {
			lease, err := l.TryAcquire(e.ctx, name, time.Minute)
			if err != nil {
				return err
			}
			return lease.Release(e.ctx)
		}, nil
	}}})
	pool.Close()
	c1 := readCapCounters(b, e, "capacity")
	got := rows[0]
	row.perSec = append(row.perSec, got.perSec...)
	row.samples = append(row.samples, got.samples...)
	row.ops += got.ops
	row.cpu += got.cpu
	row.add(c0, c1)
}

var pgbenchTPS = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// capacityPgbenchTurn runs pgbench's simple-update for secs seconds with clients
// connections and adds its tps, its transactions' latencies (its -l log) and its CPU to row.
func capacityPgbenchTurn(b *testing.B, e *benchEnv, pgbench string, clients, secs int, row *capRow) {
	b.Helper()
	dir := b.TempDir()
	c0 := readCapCounters(b, e, "pgbench")
	cmd := exec.Command(pgbench, "-b", "simple-update", "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(secs), "-M", "prepared", "-n", "-l", "--log-prefix", filepath.Join(dir, "tx"), e.url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out)
	}
	c1 := readCapCounters(b, e, "pgbench")
	m := pgbenchTPS.FindSubmatch(out)
	if m == nil {
		b.Fatalf("pgbench: no tps in its output:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	logs, _ := filepath.Glob(filepath.Join(dir, "tx.*"))
	n := 0
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// client_id transaction_no time script_no time_epoch time_us: time is the
			// transaction's latency in microseconds.
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue
			}
			row.samples = append(row.samples, time.Duration(us)*time.Microsecond)
			n++
		}
		_ = f.Close()
	}
	if n == 0 {
		b.Fatalf("pgbench: no transaction in its logs %v", logs)
	}
	row.perSec = append(row.perSec, tps)
	row.ops += n
	row.cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	row.add(c0, c1)
}

// capacityHotName runs HotName's loop with waiters contenders of mech on one name.
func capacityHotName(b *testing.B, e *benchEnv, mech string, waiters int, floor []time.Duration) {
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(2*waiters + 2) // a session lock holds a connection; its waiter takes another
	cfg.ConnConfig.RuntimeParams["application_name"] = "capacity-hot"
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	acquire := make([]func(context.Context) (func() error, error), waiters)
	for i := range acquire {
		switch mech {
		case "Lease":
			l, err := fencelock.NewLessor(pool)
			if err != nil {
				b.Fatal(err)
			}
			acquire[i] = func(ctx context.Context) (func() error, error) {
				lease, err := l.Acquire(ctx, "hot", time.Minute)
				if err != nil {
					return nil, err
				}
				return func() error { return lease.Release(e.ctx) }, nil
			}
		default:
			a, err := fencelock.NewAdvisoryLocker(pool)
			if err != nil {
				b.Fatal(err)
			}
			acquire[i] = func(ctx context.Context) (func() error, error) {
				lk, err := a.Lock(ctx, "hot")
				if err != nil {
					return nil, err
				}
				return func() error { return lk.Unlock(e.ctx) }, nil
			}
		}
	}
	rounds, turn := floorRounds()
	window := time.Duration(rounds) * turn
	b.Logf("load before: %s", loadAvg())
	var (
		mu          sync.Mutex
		lastRelease time.Time
		handoffs    []time.Duration
		measuring   atomic.Bool
		grants      atomic.Int64
		stop        atomic.Bool
		wg          sync.WaitGroup
		errOnce     sync.Once
		firstErr    error
	)
	ctx, cancel := context.WithTimeout(e.ctx, window+2*time.Minute)
	defer cancel()
	for i := range waiters {
		wg.Go(func() {
			for !stop.Load() {
				release, err := acquire[i](ctx)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				now := time.Now()
				grants.Add(1)
				mu.Lock()
				if measuring.Load() && !lastRelease.IsZero() {
					handoffs = append(handoffs, now.Sub(lastRelease))
				}
				lastRelease = time.Now()
				mu.Unlock()
				if err := release(); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	time.Sleep(max(turn/2, 500*time.Millisecond)) // warm-up: every session plans each statement
	var c0 capCounters
	c0.busy, c0.total = machineCPU(b)
	g0, t0 := grants.Load(), time.Now()
	measuring.Store(true)
	time.Sleep(window) // measuring an interval, not awaiting an event
	g1, wall := grants.Load(), time.Since(t0)
	var c1 capCounters
	c1.busy, c1.total = machineCPU(b)
	measuring.Store(false)
	stop.Store(true)
	wg.Wait()
	pool.Close()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	b.Logf("load after: %s", loadAvg())
	row := &floorRow{name: "handoff", samples: handoffs}
	b.ReportMetric(float64(g1-g0)/wall.Seconds(), "handoffs/s")
	b.ReportMetric(float64(row.quantile(0.5).Microseconds()), "handoff-p50-us")
	b.ReportMetric(float64(row.quantile(0.99).Microseconds()), "handoff-p99-us")
	fl := &floorRow{samples: floor}
	b.ReportMetric(float64(fl.quantile(0.5).Microseconds()), "floor-p50-us")
	if c1.total > c0.total {
		b.ReportMetric(float64(c1.busy-c0.busy)/float64(c1.total-c0.total), "cpu-busy")
	}
}
