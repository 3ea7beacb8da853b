// Package fencelock provides PostgreSQL-native locks with fencing tokens, for Go services whose
// protected data lives in the same Postgres.
//
// # Why fencing
//
// A lock alone does not make a write safe: a holder can pause (GC, CPU throttling, SIGSTOP)
// past its lease, wake up, and write while believing it still holds the lock. Every grant
// therefore carries a fencing token ([Token], an int64 > 0) larger than that of any earlier
// grant of the name, and the protected write is rejected, atomically, when a larger token has
// been seen. Because the fence and the data share a database, the check and the write commit
// in one transaction. This is the scheme of Kleppmann (2016), "How to do distributed locking".
//
// # Leases
//
// A [Lessor] grants named leases, rows of fencelock.leases:
//
//	l, _ := fencelock.NewLessor(pool)
//	lease, err := l.TryAcquire(ctx, "payment:42", 10*time.Second) // ErrNotAcquired if held
//	defer lease.Release(ctx)
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if err := lease.FenceTx(ctx, tx, "payment:42"); err != nil {
//			return err // *LeaseLostError: no longer ours; *StaleTokenError: a newer holder wrote
//		}
//		_, err := tx.Exec(ctx, `UPDATE payments SET status = 'captured' WHERE id = 42`)
//		return err
//	})
//
// The grant is one statement. TTLs run on the database clock. A heartbeat renews held leases,
// those that are due in batches of up to 5,000, one statement each. The holder trusts a lease
// only inside its trust window, which the lessor's trust watch ends:
//
//	grant sent        heartbeat renewals ...       last renewal sent
//	    |----------------|------------------------------|------------------------|
//	                                                    |<------ TTL - margin -->|
//	                                                                 Done() closes here
//
// [Lease.Done] closes, and [Lease.Err] says why, when the trust window ends without a
// successful renewal, when a renewal finds the lease gone, or on [Lease.Release].
//
// [Lease.Context] is a context cancelled, with the lease's error as its cause, when Done closes;
// [Lessor.RunLeased] runs a function under it and releases the lease when the function returns.
//
// [NewElection] runs leader election on fenced terms: [Election.Campaign] waits until elected,
// [Term.Resign] hands the term to the next candidate, [Election.Observe] delivers each change.
//
// Package [github.com/fencelock/fencelock/job] runs a scheduled job once per slot across
// replicas and restarts, on a lease of a lessor, with a ledger readable in SQL
// (fencelock.job_ledger).
//
// # Limits for fleets
//
// [NewSemaphore] caps the holders of a name: at most its limit of permits at once, counted on
// the database clock; a permit is a [*Lease] named "<semaphore>#<slot>" with a fencing token of
// its own, and waiters are served first come, first served. Package
// [github.com/fencelock/fencelock/ratelimit] allows at most Burst + Rate*w/Per requests per key
// in any window w of the database clock (GCRA), in one statement per request.
// [Lessor.TryAcquireAll] and [Lessor.AcquireAll] take a set of leases all
// or nothing, in one statement that takes their rows in one global order ([LeaseSet]).
//
// [Lessor.Acquire] waits in the name's queue: first come, first served. The release hands the
// lease to the head of the queue in its own statement and wakes that waiter alone, by
// LISTEN/NOTIFY on one listening connection per pool (polling behind PgBouncer in transaction
// mode, and while that connection is down: one that dies silently, a half-open TCP flow, is
// probed after 2 s of quiet and replaced when a probe goes unanswered for 2 s, so it is found
// dead within 4 s). The queue is visible in SQL: SELECT * FROM fencelock.lease_queue.
//
// # Fences
//
// [Lease.FenceTx] checks the lease and advances a resource's high-water mark to its token, in
// one statement inside the caller's transaction: the pattern for writes under a lease.
// [FenceTx] advances the high-water mark alone, for tokens that travel without a lease.
// [Lease.GuardTx] checks the lease itself inside the caller's transaction and holds its row
// FOR KEY SHARE until commit. [UpdateFencedTx] fences an update of the caller's own table that
// carries a token column. [Lessor.RunLocked] holds a lease row FOR UPDATE for the length of a
// transaction, with a fresh token and no TTL.
//
// # database/sql, any language, and tables that refuse stale writes
//
// Every call that takes the caller's pgx.Tx has a twin that takes a *sql.Tx, for services that
// write through database/sql (GORM, bun, sqlx, ent, sqlc's database/sql output, lib/pq):
// [FenceSQLTx], [UpdateFencedSQLTx], [Lease.GuardSQLTx], [Lease.FenceSQLTx],
// [LeaseSet.GuardSQLTx], [Term.FenceSQLTx], [AdvisoryLocker.TryLockSQLTx],
// [AdvisoryLocker.LockSQLTx], and [Lessor.RunLockedSQL] / [Lessor.TryRunLockedSQL], whose
// [SQLTxFunc] gets a *sql.Tx. Each sends the same statement as its pgx twin (internal/sqltx
// adapts the *sql.Tx to the generated queries), so the guarantees are the same: the fence and
// the guard durable once the transaction commits under a server default of
// synchronous_commit = off, identifiers quoted, the same typed errors under [errors.Is],
// whatever driver sits under database/sql (pgx's stdlib or lib/pq: errors are read through
// their SQLState method). Get the *sql.Tx from the ORM's own transaction: GORM's
// tx.Statement.ConnPool.(*sql.Tx), bun.Tx's Tx field, sqlx.Tx's embedded *sql.Tx.
//
// Why twins in this package rather than a sibling package (as pgx's stdlib and River's
// riverdatabasesql are): the lease, lease-set and term forms must end the lease when the
// database no longer has the grant (Done closes), which only this package can do without a back
// door; database/sql is in the standard library, so the twins add nothing to a consumer's
// go.sum; and each sits next to its pgx twin in the documentation, with the same name plus SQL.
// Two wirings work: one pgxpool.Pool shared with the *sql.DB (pgx's stdlib.OpenDBFromPool), or
// a *sql.DB opened separately on the same database (pgx's stdlib driver, lib/pq). The lessor
// itself always runs on its pgx pool.
//
// For a worker in another language, or an operator in psql, the database offers the essentials
// as SQL functions with documented SQLSTATEs (docs/SQL.md): fencelock.try_acquire, renew and
// release for a lease's life cycle, guard_lease, fence and fence_lease inside the caller's
// transaction. They share the token sequence, epochs, queue and fences with the Go lessor: a
// holder in Python and a Go lessor exclude each other on one name and fence each other's stale
// writes. fencelock.protect_table attaches a trigger to a table of the user's that refuses,
// with SQLSTATE FL004, any write carrying a token older than the row's, whoever sends it: the
// fenced storage of Kleppmann's article, built into the database the data lives in. A write
// carries its token in the transaction-local setting fencelock.token (fencelock.set_token) or
// in the table's token column; one carrying none is refused (FL006). [WrapSQLError] maps those
// SQLSTATEs to this package's sentinels ([ErrStaleToken], [ErrLeaseLost], [ErrNoToken],
// [ErrInvalidArgument]) for errors that reach the caller through an ORM.
//
// # Advisory locks
//
// An [AdvisoryLocker] takes Postgres advisory locks: session locks, each held on a pooled
// connection of its own and watched by a watchdog ([AdvisoryLock.Done]), and transaction locks
// on the caller's pgx.Tx, which also work behind PgBouncer's transaction pooling:
//
//	a, _ := fencelock.NewAdvisoryLocker(pool)
//	lk, err := a.TryLock(ctx, "nightly-report") // ErrNotAcquired if held
//	defer lk.Unlock(ctx)
//
// Names map to int64 keys by [SHA256KeyHash]; each lock call takes [LockOption]s: [Shared] for
// a shared lock, [AtKey] for a key of the caller's own. A hot standby and a connection pooler are
// refused before anything is taken ([ErrReadOnly], [ErrConnectionPooler]; a session-mode
// pooler may be declared with [WithSessionPooler]). With
// [WithFencingTokens] each grant also draws a fencing token for [FenceTx].
//
// # Operating
//
// What is held is readable in SQL: fencelock.holders (leases: holder, token, TTL left, held
// for, renewals, heartbeat, waiters), fencelock.advisory_locks (pg_locks with
// pg_stat_activity) and fencelock.lease_queue. The fencelock command (cmd/fencelock) shows
// them (locks, watch, fences), applies migrations, sweeps, and force-releases a lease with
// fencelock.force_release, which hands it on and raises the fences so that the old holder's
// writes are rejected. [WithMeterProvider] records metrics through OpenTelemetry (default: a
// no-op, or [SetDefaultMeterProvider]'s). Package [github.com/fencelock/fencelock/gooselock]
// gives goose a lock.Locker on a lease, which works behind PgBouncer. [Migrate] is a no-op for a role without DDL privileges when nothing is pending.
//
// # Errors
//
// Sentinels name states ([ErrNotAcquired], [ErrNotHeld], [ErrLeaseLost], [ErrLockLost],
// [ErrStaleToken], [ErrReadOnly], [ErrInvalidArgument], ...); typed errors carry detail and
// match them under [errors.Is] ([*StaleTokenError], [*LeaseLostError], [*SessionLostError],
// [*ArgumentError], [*PoolerError], [*KeyCollisionError]). Postgres errors are wrapped with %w.
//
// # Durability
//
// Statements that grant or renew raise synchronous_commit from off to on for themselves, so tokens
// never repeat after a crash even where the server's default is off. Migrations ship in package
// [github.com/fencelock/fencelock/migrations] and are applied by [Migrate].
//
// # Failover
//
// A [Token] carries an epoch, the server's timeline, in its high bits: a standby's promotion
// starts a new timeline, so every token drawn after it is larger than every token the old
// primary issued, even when an asynchronous standby lost the last commits. The writes those
// commits made are lost with them; synchronous replication keeps them. After a logical copy
// of the database (dump and restore, logical replication), call [RebaseTokenEpoch] before any
// grant. docs/FAILOVER.md in the repository says what survives which failover, measured.
//
// # The SQL this package owns
//
// The schema of the head, every table, view and function as it is after the last migration,
// is sqlc/schema.sql in the repository (generated from package
// [github.com/fencelock/fencelock/migrations]); the queries are in sqlc/queries. This package
// runs:
//   - leases: leases.sql (LeaseGrant, LeaseEnsureRow, LeaseRemaining, LeaseRenew,
//     LeaseReleaseUnknown, LeaseGuard, LeaseFence), queue.sql (LeaseAcquire, LeaseRelease,
//     LeaseLeaveQueue, LeaseJoinQueue) and multilocks.sql (LeaseGrantAll), over the tables
//     fencelock.leases and fencelock.lease_waiters and the functions fencelock.hand_off and
//     fencelock.grant_all;
//   - tokens: fencelock.next_token and fencelock.timeline (called by the grants), tokens.sql
//     (TokenEpochRebase, fencelock.rebase_token_epoch), tables fencelock.token_epoch and
//     fencelock.token_epoch_marks;
//   - fences: fences.sql (FenceAdvance, FenceCurrent), table fencelock.fences;
//   - semaphores: semaphores.sql (SemaphoreAcquire, SemaphoreRelease, SemaphoreNotify,
//     SemaphoreLeave, SemaphoreReleaseUnknown, SemaphoreSetLimit, SemaphoreState,
//     SemaphoreWaitersSweep) and the functions fencelock.semaphore_* they call;
//   - elections: elections.sql (ElectionProclaim, ElectionNotify, ElectionLeader);
//   - sweeps: LeaseSweep, TokenFlushesSweep, LeaseWaitersSweep.
//
// Advisory locks run advisory.sql through internal/advisory; the rate limiter
// ([github.com/fencelock/fencelock/ratelimit]) and jobs ([github.com/fencelock/fencelock/job])
// own their SQL; the fencelock command reads the views and calls fencelock.force_release.
package fencelock
