package integration

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// Each benchmark times an operation and its floor in the same loop, alternating them, on the
// same server and pool, and reports:
//   - op-us: the operation, microseconds per call;
//   - floor-us: the floor, microseconds per call;
//   - x-floor: op / floor, the figure the targets are stated in.
// Floors: a one-row autocommit UPDATE (fillfactor 70, HOT), a SELECT 1 round trip, or the bare
// write transaction (BEGIN; one-row UPDATE; COMMIT).

type benchEnv struct {
	ctx  context.Context
	pool *pgxpool.Pool
	url  string // the database's URL, for clients of other drivers
}

// benchSetup starts a dedicated server. pgtest runs servers with fsync=off; set
// FENCELOCK_BENCH_FSYNC=on to measure with WAL flushed to disk at every commit, as in
// production, where the commit's flush weighs on the floor as much as on the operation.
func benchSetup(b *testing.B) *benchEnv {
	b.Helper()
	var extra []pgtest.Option
	if dir := os.Getenv("FENCELOCK_BENCH_LOCK_LOG"); dir != "" {
		// Every lock wait over 1 ms is logged, with the statement and the PL/pgSQL line, to
		// the server's log files in dir (which outlive the server).
		extra = append(extra, pgtest.WithSetting("log_lock_waits", "on"), pgtest.WithSetting("deadlock_timeout", "1ms"),
			pgtest.WithSetting("logging_collector", "on"), pgtest.WithSetting("log_directory", dir))
	}
	return benchServer(b, os.Getenv("FENCELOCK_BENCH_FSYNC") == "on", extra...)
}

func (e *benchEnv) update(id int) func() error {
	return func() error {
		_, err := e.pool.Exec(e.ctx, `UPDATE bench SET v = v + 1 WHERE id = $1`, id)
		return err
	}
}

// writeTx returns a one-row write transaction that first runs check in it, if not nil.
func (e *benchEnv) writeTx(check func(pgx.Tx) error) func() error {
	return func() error {
		return pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
			if check != nil {
				if err := check(tx); err != nil {
					return err
				}
			}
			_, err := tx.Exec(e.ctx, `UPDATE bench SET v = v + 1 WHERE id = 2`)
			return err
		})
	}
}

func (e *benchEnv) selectOne() error {
	var one int
	return e.pool.QueryRow(e.ctx, `SELECT 1`).Scan(&one)
}

// ratio runs op and floor alternately, after a warm-up, and reports both and their ratio.
func ratio(b *testing.B, op, floor func() error) {
	b.Helper()
	for range 200 { // warm the pool, the statement caches and the server's buffers
		if err := floor(); err != nil {
			b.Fatal(err)
		}
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	var tOp, tFloor time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		if err := floor(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		tOp += time.Since(t1)
		tFloor += t1.Sub(t0)
		n++
	}
	b.ReportMetric(float64(tOp.Microseconds())/float64(n), "op-us")
	b.ReportMetric(float64(tFloor.Microseconds())/float64(n), "floor-us")
	b.ReportMetric(float64(tOp)/float64(tFloor), "x-floor")
}

func twice(f func() error) func() error {
	return func() error {
		if err := f(); err != nil {
			return err
		}
		return f()
	}
}

// BenchmarkTryAcquireRelease: an uncontended grant and its release, beside two one-row
// UPDATEs (target: within 1.15x).
func BenchmarkTryAcquireRelease(b *testing.B) {
	e := benchSetup(b)
	l, err := fencelock.NewLessor(e.pool)
	if err != nil {
		b.Fatal(err)
	}
	ratio(b, func() error {
		lease, err := l.TryAcquire(e.ctx, "bench", time.Minute)
		if err != nil {
			return err
		}
		return lease.Release(e.ctx)
	}, twice(e.update(1)))
}

// BenchmarkRenew: one renewal beside one one-row UPDATE.
func BenchmarkRenew(b *testing.B) {
	e := benchSetup(b)
	l, err := fencelock.NewLessor(e.pool, fencelock.WithoutHeartbeat())
	if err != nil {
		b.Fatal(err)
	}
	lease, err := l.TryAcquire(e.ctx, "bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	defer lease.Release(e.ctx)
	ratio(b, func() error { return lease.Renew(e.ctx) }, e.update(1))
}

// BenchmarkFenceTx: a write transaction with the fence check, beside the same transaction
// without it (the fence adds one statement).
func BenchmarkFenceTx(b *testing.B) {
	e := benchSetup(b)
	ratio(b, e.writeTx(func(tx pgx.Tx) error { return fencelock.FenceTx(e.ctx, tx, "bench", 1) }), e.writeTx(nil))
}

// BenchmarkLeaseFenceTx: a write transaction with Lease.FenceTx (the lease check and the fence
// in one statement), beside the same transaction without it.
func BenchmarkLeaseFenceTx(b *testing.B) {
	e := benchSetup(b)
	l, err := fencelock.NewLessor(e.pool)
	if err != nil {
		b.Fatal(err)
	}
	lease, err := l.TryAcquire(e.ctx, "bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	defer lease.Release(e.ctx)
	ratio(b, e.writeTx(func(tx pgx.Tx) error { return lease.FenceTx(e.ctx, tx, "bench") }), e.writeTx(nil))
}

// BenchmarkRunLocked: the transaction-scoped row lock around a one-row write, beside the bare
// write transaction (target: within 1.3x).
func BenchmarkRunLocked(b *testing.B) {
	e := benchSetup(b)
	l, err := fencelock.NewLessor(e.pool)
	if err != nil {
		b.Fatal(err)
	}
	const write = `UPDATE bench SET v = v + 1 WHERE id = 3`
	ratio(b, func() error {
		return l.TryRunLocked(e.ctx, "bench", func(ctx context.Context, tx pgx.Tx, _ fencelock.Token) error {
			_, err := tx.Exec(ctx, write)
			return err
		})
	}, func() error {
		return pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(e.ctx, write)
			return err
		})
	})
}

// BenchmarkSelectOneVsUpdate: the two floors side by side, for the table in docs.
func BenchmarkSelectOneVsUpdate(b *testing.B) {
	e := benchSetup(b)
	ratio(b, e.update(1), e.selectOne)
}

// BenchmarkTryAcquireReleaseVsLeaseRowUpdate: the grant and release beside two one-row
// UPDATEs of a fencelock.leases row (text key, the lease's own columns): the structural floor
// of any lease table, which the int-keyed floor above does not carry.
func BenchmarkTryAcquireReleaseVsLeaseRowUpdate(b *testing.B) {
	e := benchSetup(b)
	l, err := fencelock.NewLessor(e.pool)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
		VALUES ('floor', 'floor', now(), now())`); err != nil {
		b.Fatal(err)
	}
	ratio(b, func() error {
		lease, err := l.TryAcquire(e.ctx, "bench", time.Minute)
		if err != nil {
			return err
		}
		return lease.Release(e.ctx)
	}, twice(func() error {
		_, err := e.pool.Exec(e.ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = $1`, "floor")
		return err
	}))
}
