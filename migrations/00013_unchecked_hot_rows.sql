-- +goose Up
-- Rows written on every grant, renewal, release, hand-off and fenced write carry no CHECK
-- constraint (issue 23: speed at the physical floor).
--
-- Why: PostgreSQL evaluates every CHECK constraint of a table for every row an INSERT or an
-- UPDATE writes, whichever columns the UPDATE sets, and each execution of a statement first
-- rebuilds each constraint's expression from its stored text (ExecRelCheck: stringToNode, the
-- expression planner, ExecInitExpr). Measured with pg_stat_statements, prepared statements,
-- one backend: `UPDATE fencelock.leases SET expires_at = clock_timestamp() WHERE name = $1`
-- took 13.1 us with the two length checks and 4.0 us on an identical table without them (a
-- copy with the checks folded into one constraint: 15.0 us, so it is per constraint and per
-- statement, not per expression); the grant's INSERT ... ON CONFLICT DO UPDATE pays them twice
-- (the INSERT's tuple, then the update's): 15.3 us against 6.0 us. That was a fifth of a
-- grant's and half of a release's server time.
--
-- What checks the values instead: every writer of these rows is a fencelock statement whose
-- values come from the Go API, which refuses bad input with a typed error before any SQL runs
-- (names and resources: 1 to 1024 bytes of UTF-8 without NUL, validate.go; holders: the same,
-- NewLessor; fencing tokens > 0, fencing.go; TTLs within [MinTTL, MaxTTL], config.go), or a
-- function of this schema called with values the same API validated (the `fencelock release`
-- command checks its NAME and --fence resources the same way before it calls
-- fencelock.force_release). A row written by hand with SQL outside fencelock is not checked:
-- the columns keep their NOT NULL and types, and nothing else. The constraints of
-- rows written rarely (token_epoch, semaphores, election_values, job_runs, token_epoch_marks)
-- stay.
ALTER TABLE fencelock.leases DROP CONSTRAINT leases_name_length, DROP CONSTRAINT leases_holder_length;
ALTER TABLE fencelock.fences DROP CONSTRAINT fences_resource_length, DROP CONSTRAINT fences_token_positive;
ALTER TABLE fencelock.lease_waiters DROP CONSTRAINT lease_waiters_ttl_us_check;

-- +goose Down
ALTER TABLE fencelock.lease_waiters ADD CONSTRAINT lease_waiters_ttl_us_check CHECK (ttl_us >= 0);
ALTER TABLE fencelock.fences
    ADD CONSTRAINT fences_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 1024),
    ADD CONSTRAINT fences_token_positive CHECK (token > 0);
ALTER TABLE fencelock.leases
    ADD CONSTRAINT leases_name_length CHECK (octet_length(name) BETWEEN 1 AND 1024),
    ADD CONSTRAINT leases_holder_length CHECK (octet_length(holder) BETWEEN 1 AND 1024);
