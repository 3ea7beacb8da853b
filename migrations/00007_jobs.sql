-- +goose Up
-- Scheduled jobs that run once per slot (issue 12). A job's runs are serialised by a lease of
-- the job's name; each slot's run is claimed in this ledger, keyed by (job, slot), under that
-- lease, so a slot runs at most once across all replicas and restarts, unless its policy
-- retries a run that crashed (finished_at NULL, by an earlier grant) or failed.
CREATE TABLE fencelock.job_runs (
    job         text        NOT NULL,
    slot        timestamptz NOT NULL,
    holder      text        NOT NULL,
    token       bigint      NOT NULL,
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    succeeded   boolean,
    error       text,
    PRIMARY KEY (job, slot),
    CONSTRAINT job_runs_job_length CHECK (octet_length(job) BETWEEN 1 AND 1024)
) WITH (fillfactor = 70);

-- The ledger, readable by SQL: each slot's run with its holder, token, attempt, times and
-- outcome: succeeded, failed, running (unfinished, its grant still current), crashed
-- (unfinished, its grant gone: expired or taken over; a guarded transaction of the run already
-- open may still commit), or missed (token 0: given up unrun by Job.Every, past its horizon).
CREATE VIEW fencelock.job_ledger AS
SELECT r.job, r.slot, r.holder, r.token, r.attempt, r.started_at, r.finished_at,
       CASE WHEN r.token = 0 THEN 'missed'
            WHEN r.finished_at IS NOT NULL AND r.succeeded THEN 'succeeded'
            WHEN r.finished_at IS NOT NULL THEN 'failed'
            WHEN EXISTS (SELECT 1 FROM fencelock.leases AS l
                         WHERE l.name = r.job AND l.token = r.token AND l.expires_at > clock_timestamp()) THEN 'running'
            ELSE 'crashed' END AS outcome,
       r.error
FROM fencelock.job_runs AS r;

-- Roles that take leases may run jobs (fencelock.grant_to_lease_roles: migration 00006).
SELECT fencelock.grant_to_lease_roles('SELECT, INSERT, UPDATE, DELETE', 'fencelock.job_runs');
SELECT fencelock.grant_to_lease_roles('SELECT', 'fencelock.job_ledger');

-- +goose Down
DROP VIEW fencelock.job_ledger;
DROP TABLE fencelock.job_runs;
