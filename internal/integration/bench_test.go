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

// benchLessor returns a lessor on pool with opts, failing b on error.
func benchLessor(b *testing.B, pool *pgxpool.Pool, opts ...fencelock.LessorOption) *fencelock.Lessor {
	b.Helper()
	return newOnPool(b, fencelock.NewLessor, pool, opts...)
}

// benchLocker returns an advisory locker on pool with opts, failing b on error.
func benchLocker(b *testing.B, pool *pgxpool.Pool, opts ...fencelock.AdvisoryOption) *fencelock.AdvisoryLocker {
	b.Helper()
	return newOnPool(b, fencelock.NewAdvisoryLocker, pool, opts...)
}

// newOnPool returns what newT makes on pool with opts (a lessor, an advisory locker), failing
// b on error.
func newOnPool[T, O any](b *testing.B, newT func(*pgxpool.Pool, ...O) (T, error), pool *pgxpool.Pool, opts ...O) T {
	b.Helper()
	v, err := newT(pool, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// benchLease returns a lease on "bench" for an hour from a lessor of its own on e's pool with
// opts, released when the benchmark ends.
func benchLease(b *testing.B, e *benchEnv, opts ...fencelock.LessorOption) *fencelock.Lease {
	b.Helper()
	lease, err := benchLessor(b, e.pool, opts...).TryAcquire(e.ctx, "bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lease.Release(e.ctx) })
	return lease
}

// held returns a call that takes a grant with take and returns the call that ends it with end:
// the form in which handoff and contention take a lock, a lease or a term.
func held[H any](take func() (H, error), end func(H) error) func() (func() error, error) {
	return func() (func() error, error) {
		h, err := take()
		if err != nil {
			return nil, err
		}
		return func() error { return end(h) }, nil
	}
}

// heldLock is held for an advisory lock of name taken with lock (an AdvisoryLocker's Lock or
// TryLock) and unlocked, on ctx.
func heldLock(ctx context.Context, lock func(context.Context, string, ...fencelock.LockOption) (*fencelock.AdvisoryLock, error), name string) func() (func() error, error) {
	return held(func() (*fencelock.AdvisoryLock, error) { return lock(ctx, name) },
		func(lk *fencelock.AdvisoryLock) error { return lk.Unlock(ctx) })
}

// heldLease is held for a lease of name with ttl taken with acquire (a Lessor's Acquire or
// TryAcquire) and released, on ctx.
func heldLease(ctx context.Context, acquire func(context.Context, string, time.Duration) (*fencelock.Lease, error), name string, ttl time.Duration) func() (func() error, error) {
	return held(func() (*fencelock.Lease, error) { return acquire(ctx, name, ttl) },
		func(lease *fencelock.Lease) error { return lease.Release(ctx) })
}

// heldTerm is held for a term of el won with Campaign(value) and resigned, on ctx.
func heldTerm(ctx context.Context, el *fencelock.Election, value string) func() (func() error, error) {
	return held(func() (*fencelock.Term, error) { return el.Campaign(ctx, value) },
		func(t *fencelock.Term) error { return t.Resign(ctx) })
}

// takeAndEnd returns a call that takes a grant with hold (as held returns it) and ends it at
// once: an uncontended grant and its release.
func takeAndEnd(hold func() (func() error, error)) func() error {
	return func() error {
		end, err := hold()
		if err != nil {
			return err
		}
		return end()
	}
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
	l := benchLessor(b, e.pool)
	ratio(b, takeAndEnd(heldLease(e.ctx, l.TryAcquire, "bench", time.Minute)), twice(e.update(1)))
}

// BenchmarkRenew: one renewal beside one one-row UPDATE.
func BenchmarkRenew(b *testing.B) {
	e := benchSetup(b)
	lease := benchLease(b, e, fencelock.WithoutHeartbeat())
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
	lease := benchLease(b, e)
	ratio(b, e.writeTx(func(tx pgx.Tx) error { return lease.FenceTx(e.ctx, tx, "bench") }), e.writeTx(nil))
}

// BenchmarkRunLocked: the transaction-scoped row lock around a one-row write, beside the bare
// write transaction (target: within 1.3x).
func BenchmarkRunLocked(b *testing.B) {
	e := benchSetup(b)
	l := benchLessor(b, e.pool)
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
	l := benchLessor(b, e.pool)
	if _, err := e.pool.Exec(e.ctx, `INSERT INTO fencelock.leases (name, holder, acquired_at, expires_at)
		VALUES ('floor', 'floor', now(), now())`); err != nil {
		b.Fatal(err)
	}
	ratio(b, takeAndEnd(heldLease(e.ctx, l.TryAcquire, "bench", time.Minute)), twice(func() error {
		_, err := e.pool.Exec(e.ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = $1`, "floor")
		return err
	}))
}
