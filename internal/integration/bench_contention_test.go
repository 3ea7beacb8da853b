package integration

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// contenders is the number of lessors (or advisory lockers) of BenchmarkContention.
const contenders = 16

// BenchmarkContention: 16 contenders for one name, each in a loop: wait for it (Lessor.Acquire,
// or AdvisoryLocker.Lock), hold it for a uniform random time in [0, 10 ms), release it, and
// queue again, until b.N grants in all. It reports:
//   - handoff-p50-us, handoff-p99-us: from the moment a holder starts its release to the next
//     grant's return;
//   - share-min, share-max: the grants of the least and of the most favoured contender, as a
//     multiple of the fair share (b.N / 16);
//   - regrant: the fraction of grants that went to the contender that had just released;
//   - commits/grant, wal-writes/grant (over the warm-up's grants too): transactions committed in the database
//     (pg_stat_database.xact_commit, read-only ones included) and WAL writes of the server
//     (pg_stat_wal.wal_write: with fsync=off, the count of WAL flush requests that wrote), per
//     grant, read once the contenders' sessions have exited and flushed their statistics.
//
// The figures before the fair queue of waiters are the baseline of that work (docs/PERFORMANCE.md).
func BenchmarkContention(b *testing.B) {
	b.Run("Lease", func(b *testing.B) {
		withFsync(b, func(b *testing.B, e *benchEnv) {
			contention(b, e, func(pool *pgxpool.Pool) func() (func() error, error) {
				return heldLease(e.ctx, benchLessor(b, pool).Acquire, "contended", time.Minute)
			})
		}, withStatementStats()...)
	})
	b.Run("Advisory", func(b *testing.B) {
		withFsync(b, func(b *testing.B, e *benchEnv) {
			contention(b, e, func(pool *pgxpool.Pool) func() (func() error, error) {
				return heldLock(e.ctx, benchLocker(b, pool).Lock, "contended")
			})
		}, withStatementStats()...)
	})
}

// contention runs the loop of BenchmarkContention with one contender per call of newContender,
// each given the contenders' pool, and reports its figures.
func contention(b *testing.B, e *benchEnv, newContender func(*pgxpool.Pool) func() (func() error, error)) {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 2*contenders + 2 // a session lock holds a connection; its waiter takes another
	cfg.ConnConfig.RuntimeParams["application_name"] = "contender"
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	acquire := make([]func() (func() error, error), contenders)
	for i := range acquire {
		acquire[i] = newContender(pool)
	}
	floor := notifyFloor(b, e, 300)
	commits0, walWrites0 := serverCounters(b, e)
	resetStatementStats(b, e)

	var (
		mu          sync.Mutex
		lastRelease time.Time // when the last holder started its release
		lastHolder  = -1
		handoffs    []time.Duration
		releases    []time.Duration // how long each release took (the releasing holder's call)
		grants      [contenders]int
		regrants    int
		remaining   atomic.Int64
	)
	// A warm-up of 20 grants per contender first, measured only in the commits and WAL writes
	// per grant (over all grants): every pooled session has then run each statement more than
	// the 5 times after which the server plans it once for good (prepared statements, and
	// PL/pgSQL's own), and compiled the PL/pgSQL functions, as the long-lived sessions of a
	// service have.
	const warm = 20 * contenders
	remaining.Store(int64(b.N + warm))
	var granted int
	errs := make(chan error, contenders)
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := range contenders {
		wg.Go(func() {
			for remaining.Add(-1) >= 0 {
				release, err := acquire[i]()
				if err != nil {
					errs <- err
					return
				}
				now := time.Now()
				mu.Lock()
				if granted++; granted > warm {
					if !lastRelease.IsZero() {
						handoffs = append(handoffs, now.Sub(lastRelease))
					}
					if lastHolder == i {
						regrants++
					}
					grants[i]++
				}
				mu.Unlock()
				time.Sleep(rand.N(10 * time.Millisecond))
				mu.Lock()
				lastRelease, lastHolder = time.Now(), i
				mu.Unlock()
				t0 := time.Now()
				if err := release(); err != nil {
					errs <- err
					return
				}
				d := time.Since(t0)
				mu.Lock()
				if granted > warm {
					releases = append(releases, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	pool.Close()
	commits1, walWrites1 := serverCounters(b, e)
	logStatements(b, e, float64(b.N+warm), "grant")
	floor = append(floor, notifyFloor(b, e, 300)...)
	slices.Sort(floor)
	b.ReportMetric(float64(floor[len(floor)/2].Microseconds()), "floor-p50-us")
	b.ReportMetric(float64(floor[len(floor)*99/100].Microseconds()), "floor-p99-us")

	n := float64(b.N)
	slices.Sort(handoffs)
	if len(handoffs) > 0 {
		b.ReportMetric(float64(handoffs[len(handoffs)/2].Microseconds()), "handoff-p50-us")
		b.ReportMetric(float64(handoffs[len(handoffs)*99/100].Microseconds()), "handoff-p99-us")
		b.ReportMetric(float64(handoffs[len(handoffs)/2])/float64(floor[len(floor)/2]), "handoff-p50-x-floor")
	}
	slices.Sort(releases)
	if len(releases) > 0 {
		b.ReportMetric(float64(releases[len(releases)/2].Microseconds()), "release-p50-us")
		b.ReportMetric(float64(releases[len(releases)*99/100].Microseconds()), "release-p99-us")
	}
	fair := n / contenders
	b.ReportMetric(float64(slices.Min(grants[:]))/fair, "share-min")
	b.ReportMetric(float64(slices.Max(grants[:]))/fair, "share-max")
	b.ReportMetric(float64(regrants)/n, "regrant")
	b.ReportMetric(float64(commits1-commits0)/(n+warm), "commits/grant")
	b.ReportMetric(float64(walWrites1-walWrites0)/(n+warm), "wal-writes/grant")
}

// serverCounters returns the database's committed transactions and the server's WAL writes,
// once every session of the contenders' pool has exited: a backend flushes its statistics at
// exit, so none of theirs is left pending.
func serverCounters(b *testing.B, e *benchEnv) (commits, walWrites int64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	for {
		var left int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'contender'`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		select {
		case <-ctx.Done():
			b.Fatalf("the contenders' sessions did not exit: %v", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		(SELECT wal_write FROM pg_stat_wal)`).Scan(&commits, &walWrites); err != nil {
		b.Fatal(err)
	}
	return commits, walWrites
}

// notifyFloor measures n times the physical floor of a hand-off through the database: one
// session commits a one-row UPDATE (durably, as a grant's token must be) that NOTIFYs, and
// another session, waiting for the notification, receives it. Each sample runs from the
// statement's send to the receipt; nothing else runs meanwhile.
func notifyFloor(b *testing.B, e *benchEnv, n int) []time.Duration {
	b.Helper()
	listener, err := pgx.Connect(e.ctx, e.url)
	if err != nil {
		b.Fatal(err)
	}
	defer listener.Close(e.ctx)
	if _, err := listener.Exec(e.ctx, `LISTEN handoff_floor`); err != nil {
		b.Fatal(err)
	}
	out := make([]time.Duration, 0, n)
	for i := range n + 20 { // 20 warm-up rounds
		t0 := time.Now()
		if _, err := e.pool.Exec(e.ctx, `WITH u AS (UPDATE bench SET v = v + 1 WHERE id = 1 RETURNING v)
			SELECT pg_notify('handoff_floor', u.v::text) FROM u`); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		_, err := listener.WaitForNotification(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if i >= 20 {
			out = append(out, time.Since(t0))
		}
	}
	return out
}

// logStatements logs the statements the server ran since resetStatementStats, per unit (calls
// over n), with their mean execution time: what a row's cost is made of, in statements.
func logStatements(b *testing.B, e *benchEnv, n float64, unit string) {
	b.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT calls, mean_exec_time, mean_plan_time, plans, regexp_replace(left(query, 90), '\s+', ' ', 'g')
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_%' ORDER BY calls DESC, mean_exec_time DESC LIMIT 16`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var calls int64
		var mean, plan float64
		var plans int64
		var query string
		if err := rows.Scan(&calls, &mean, &plan, &plans, &query); err != nil {
			b.Fatal(err)
		}
		b.Logf("%6.2f per %s, %7.1f us (planned %.2f per %s, %.1f us): %s", float64(calls)/n, unit, mean*1000, float64(plans)/n, unit, plan*1000, query)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
}
