// Package job runs a scheduled job at most once per slot across every replica and restart, on a
// lease of a [fencelock.Lessor]: [New] returns a [*Job], [Job.Every] runs it once per period
// of the database clock, and [Job.RunSlot] runs one slot the caller names.
//
//	j, err := job.New(lessor, "nightly-report", time.Minute) // the TTL bounds a crashed run
//	err = j.Every(ctx, time.Hour, func(ctx context.Context, run *job.Run) error {
//		// run.Slot, run.Attempt; fence the run's writes with run.Lease.FenceTx(ctx, tx, ...)
//		return report(ctx, run.Slot)
//	}, nil)
//
// # The ledger
//
// A job's runs are serialised by a lease of the job's name (an ordinary lease of the lessor:
// renewed by its heartbeat, fenced by its token), and each slot's run is claimed under that
// lease in a ledger keyed by (job, slot). The claim is scoped to the lease's grant (name,
// holder, token) and commits synchronously, so a slot runs at most once across replicas and
// restarts, whatever the replicas' clocks say. A run's outcome is recorded under the same
// grant: a run that lost its lease, or whose replica died or shut down midway, records
// nothing, and its slot reads crashed; [WithRetryCrashed] and [WithRetryFailed] run such slots
// again. The idea is ShedLock's (lockAtMostFor is the lease's TTL, lockAtLeastFor is
// [WithHoldAtLeast]), with a ledger per slot instead of a lock per job, and fencing tokens for
// the run's writes.
//
//	replica A: JobSettled -> TryAcquire(job) -> JobClaim(slot) -> fn -> JobFinish -> Release
//	replica B: JobSettled (settled: ErrSlotDone, no lease taken)
//
// # The SQL it owns
//
// The table fencelock.job_runs and the view fencelock.job_ledger (each slot's holder, token,
// attempt, times and outcome: succeeded, failed, running, crashed, missed), created by
// migration 00007_jobs.sql, applied by fencelock.Migrate with the others: this package only
// reads and writes them. Keep the table's size in hand yourself (DELETE FROM
// fencelock.job_runs WHERE job = $1 AND slot < now() - interval '30 days'). The queries of
// sqlc/queries/jobs.sql, generated into internal/db:
//
//   - JobSettled: whether a slot is settled (run, running, or not to be run again), read
//     without the lease;
//   - JobClaim: claims a slot under the job's current grant, whose row it holds FOR KEY SHARE;
//   - JobFinish: records a run's outcome, only while its grant is current;
//   - JobSlot: the slot of a period that the database clock is in ([Job.Every]);
//   - JobLastSlot: where a replica that starts picks up ([Job.Every]);
//   - JobGiveUp: records a slot given up past its horizon as missed ([Job.Every]).
//
// The job's lease itself is the lessor's (fencelock.leases, taken, renewed and released by
// package fencelock's statements); a run that finds its grant gone on the database confirms
// the loss with [fencelock.Lease.GuardTx]. No server function belongs to this package.
//
// # Errors
//
// Bad input is refused before any SQL runs with a [*fencelock.ArgumentError] (matching
// [fencelock.ErrInvalidArgument]). [ErrSlotDone] and [ErrSlotBusy] are this package's own;
// the lease's errors are package fencelock's ([fencelock.ErrLeaseLost],
// [*fencelock.LeaseLostError], [fencelock.ErrReadOnly], ...). Other errors are pgx's, wrapped
// with %w.
package job
