package fencelock

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// sweepPageSize is how many lease rows one sweep statement reads (in name order) and at most
// deletes: a few milliseconds of row locks, which a grant of one of those names waits for.
const sweepPageSize = 500

// DefaultSweepGrace is a grace period for [SweepLeases]: long enough to ride over a step of
// the database clock, short enough that rows of finished work do not pile up.
const DefaultSweepGrace = time.Hour

// MinSweepGrace is the shortest grace period [SweepLeases] accepts. A grant that found no row
// draws its token before it inserts one; were the row of an earlier grant deleted within that
// one statement, the later grant could carry the smaller token. A minute is many times any
// statement's length.
const MinSweepGrace = time.Minute

// SweepLeases deletes the rows of fencelock.leases that expired more than grace ago on the
// database clock, and returns how many it deleted. Lease rows are never deleted otherwise, so a
// workload keyed by entity ("payment:<id>") grows the table by a row (about 300 bytes) per name
// until swept: run it periodically (from one process or several; concurrent sweeps are safe).
//
// Why it is safe: renewals, [Lease.GuardTx] and [Lease.FenceTx] act only on rows unexpired on
// the database clock, so no grant can be renewed or guarded through an expired row; tokens come
// from a sequence, not the row, so a name granted again after its row was deleted still gets a
// larger token than every earlier grant. grace (a time.Duration of at least [MinSweepGrace];
// [DefaultSweepGrace] is a sensible choice) keeps rows for that long after expiry: a database
// clock stepped back by less than grace cannot bring a deleted row back to life, a grant in
// flight cannot see its name's row vanish, and the last holder of a name stays visible.
//
// It works in pages of 500 rows in name order, one short statement each, so it reads every row
// once and never holds more than 500 row locks at a time; rows locked by anyone (a grant taking
// a name over, a transaction-scoped holder) are skipped, never waited for. A try grant of a
// name whose expired row a page is deleting is refused ([ErrNotAcquired]; [Lessor.Acquire]
// tries again), a RunLocked waits for that one statement (milliseconds; see
// docs/PERFORMANCE.md). It also deletes the rows of fencelock.token_flushes left by exited
// backends, and the rows of fencelock.lease_waiters that left their queue (expired, or handed a
// grant) and of fencelock.semaphore_waiters that expired, more than grace ago; the count
// returned is of lease rows only (semaphore permits included).
//
// Fence rows (fencelock.fences) are not swept, and must not be on a timer: a fence row
// dropped while a paused holder still carries an old token would let that token through. Drop
// a fence row only with the resource it guards, in the same transaction, when nothing will
// ever write to that resource again; or keep the token on the resource's own row with
// [UpdateFencedTx], which needs no fence row.
//
// Errors: an [*ArgumentError] for a nil pool or a grace under MinSweepGrace (before any SQL); ctx's
// error or the pgx error, wrapped, with the rows deleted so far. Safe for concurrent use.
func SweepLeases(ctx context.Context, pool *pgxpool.Pool, grace time.Duration) (int64, error) {
	if pool == nil {
		return 0, argError("pool", "must not be nil")
	}
	if grace < MinSweepGrace {
		return 0, argError("grace", "is %v; it must be at least MinSweepGrace (%v)", grace, MinSweepGrace)
	}
	q := db.New()
	var deleted int64
	for after := ""; ; {
		row, err := q.LeaseSweep(ctx, pool, db.LeaseSweepParams{After: after, PageSize: sweepPageSize, GraceUs: grace.Microseconds()})
		if err != nil {
			return deleted, wrapPg("sweep leases", err)
		}
		deleted += row.Deleted
		if row.Last == "" {
			break
		}
		after = row.Last
	}
	if _, err := q.TokenFlushesSweep(ctx, pool); err != nil {
		return deleted, wrapPg("sweep token flushes", err)
	}
	if _, err := q.LeaseWaitersSweep(ctx, pool, grace.Microseconds()); err != nil {
		return deleted, wrapPg("sweep lease queues", err)
	}
	if _, err := q.SemaphoreWaitersSweep(ctx, pool, grace.Microseconds()); err != nil {
		return deleted, wrapPg("sweep semaphore queues", err)
	}
	return deleted, nil
}
