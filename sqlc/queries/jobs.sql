-- name: JobClaim :one
-- Claims slot @slot of job @job for the grant (@job, @holder, @token), which must be the
-- current, unexpired grant of the job's lease (the job's runs are serialised by it). A slot not
-- in the ledger is claimed (attempt 1). A slot already there is claimed again only when its
-- policy allows: @retry_crashed and the run is unfinished under an earlier grant (that grant is
-- gone: this one holds the lease), or @retry_failed and the run failed. claimed is false, with
-- the existing run's outcome, otherwise. The commit is synchronous (the grant's token is in
-- the row): a claim lost in a crash would let the slot run twice.
WITH cfg AS MATERIALIZED (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) AS sync_commit
), cur AS (
    SELECT l.name FROM fencelock.leases AS l, cfg
    WHERE l.name = sqlc.arg(job)::text AND l.holder = sqlc.arg(holder)::text
      AND l.token = sqlc.arg(token)::bigint AND l.expires_at > clock_timestamp()
    FOR KEY SHARE OF l
), claim AS (
    INSERT INTO fencelock.job_runs AS r (job, slot, holder, token, attempt, started_at)
    SELECT cur.name, sqlc.arg(slot)::timestamptz, sqlc.arg(holder)::text, sqlc.arg(token)::bigint, 1, clock_timestamp() FROM cur
    ON CONFLICT (job, slot) DO UPDATE
        SET holder = excluded.holder, token = excluded.token, attempt = r.attempt + 1,
            started_at = excluded.started_at, finished_at = NULL, succeeded = NULL, error = NULL
        WHERE r.token < excluded.token
          AND ((r.finished_at IS NULL AND sqlc.arg(retry_crashed)::boolean)
               OR (r.finished_at IS NOT NULL AND NOT r.succeeded AND r.token > 0 AND sqlc.arg(retry_failed)::boolean))
    RETURNING r.attempt
)
SELECT EXISTS (SELECT 1 FROM claim) AS claimed,
       coalesce((SELECT attempt FROM claim), 0)::integer AS attempt,
       EXISTS (SELECT 1 FROM cur) AS current;

-- name: JobFinish :execrows
-- Records the end of the run of slot @slot claimed by @token: succeeded, or failed with @error.
-- Scoped to the claim's token, and only while that grant (@job, @holder, @token) is the job
-- lease's current, unexpired one (locked FOR KEY SHARE, as a guard): a run that lost its lease,
-- or was paused past it, records nothing, and its slot reads crashed.
UPDATE fencelock.job_runs AS r
SET finished_at = clock_timestamp(), succeeded = sqlc.arg(succeeded)::boolean,
    error = nullif(sqlc.arg(error)::text, '')
FROM (SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) AS sync_commit) AS cfg,
     (SELECT l.name FROM fencelock.leases AS l
      WHERE l.name = sqlc.arg(job)::text AND l.holder = sqlc.arg(holder)::text
        AND l.token = sqlc.arg(token)::bigint AND l.expires_at > clock_timestamp()
      FOR KEY SHARE) AS cur
WHERE r.job = sqlc.arg(job)::text AND r.slot = sqlc.arg(slot)::timestamptz AND r.token = sqlc.arg(token)::bigint;

-- name: JobSlot :one
-- The slot of period @every_us (microseconds) that the database clock is in, counted from the
-- Unix epoch, and how long until the next one starts, in microseconds.
SELECT ('epoch'::timestamptz + (floor(extract(epoch FROM n.now) * 1000000.0)::bigint / sqlc.arg(every_us)::bigint * sqlc.arg(every_us)::bigint)::float8 * interval '1 microsecond')::timestamptz AS slot,
       (sqlc.arg(every_us)::bigint - floor(extract(epoch FROM n.now) * 1000000.0)::bigint % sqlc.arg(every_us)::bigint)::bigint AS until_next_us
FROM (SELECT clock_timestamp() AS now) AS n;

-- name: JobSettled :one
-- Whether slot @slot of job @job is settled without taking the job's lease: run, or running,
-- or (by its policy) not to be run again. Only a slot this says is unsettled needs the lease;
-- the claim under the lease decides (JobClaim).
SELECT EXISTS (
    SELECT 1 FROM fencelock.job_runs AS r
    WHERE r.job = sqlc.arg(job)::text AND r.slot = sqlc.arg(slot)::timestamptz
      AND (r.token = 0
           OR (r.finished_at IS NOT NULL AND (r.succeeded OR NOT sqlc.arg(retry_failed)::boolean))
           OR (r.finished_at IS NULL AND NOT sqlc.arg(retry_crashed)::boolean))
) AS settled;

-- name: JobLastSlot :one
-- Where a replica of job @job that starts picks up, from the ledger between @since and @until:
-- the latest slot there, and the oldest one its policy would run again (@retry_crashed: an
-- unfinished run whose grant is gone; @retry_failed: a failed run); the Unix epoch for none.
SELECT coalesce(max(r.slot), 'epoch'::timestamptz)::timestamptz AS last,
       coalesce(min(r.slot) FILTER (WHERE r.token > 0 AND (
           (r.finished_at IS NULL AND sqlc.arg(retry_crashed)::boolean
            AND NOT EXISTS (SELECT 1 FROM fencelock.leases AS l
                            WHERE l.name = r.job AND l.token = r.token AND l.expires_at > clock_timestamp()))
           OR (r.finished_at IS NOT NULL AND NOT r.succeeded AND sqlc.arg(retry_failed)::boolean))),
                'epoch'::timestamptz)::timestamptz AS oldest_retry
FROM fencelock.job_runs AS r
WHERE r.job = sqlc.arg(job)::text AND r.slot >= sqlc.arg(since)::timestamptz AND r.slot <= sqlc.arg(until)::timestamptz;

-- name: JobGiveUp :exec
-- Records slot @slot of job @job as missed (token 0, attempt 0): Job.Every gave it up, older than
-- its horizon, unrun. Only where the ledger has no run of it: a claim that got there first wins.
INSERT INTO fencelock.job_runs (job, slot, holder, token, attempt, started_at, finished_at, succeeded, error)
VALUES (sqlc.arg(job)::text, sqlc.arg(slot)::timestamptz, sqlc.arg(holder)::text, 0, 0, clock_timestamp(), clock_timestamp(), false,
        'missed: the job''s lease was held past the slot''s horizon')
ON CONFLICT (job, slot) DO NOTHING;
