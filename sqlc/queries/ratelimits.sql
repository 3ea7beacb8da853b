-- name: RateAllow :one
-- One request against the GCRA state of key $1 (migration 00009), in one UPDATE of its row on
-- the database clock: $2 is the request's cost (n x the emission interval), $3 the cost less
-- the tolerance (burst x the emission interval), both intervals of whole microseconds. Allowed
-- when greatest(tat, t) + $3 <= t; tat then moves to greatest(tat, t) + $2. No row comes back
-- when the key has none: its first request runs RateCreate, then this again. (Positional parameters: sqlc
-- cannot rewrite named ones inside SET (...) = (SELECT ...).)
--  * t, the decision's time, is clock_timestamp() read once the row is locked (in the
--    correlated sub-select of SET, which the UPDATE evaluates on the row's latest version
--    under its lock), not now(): a statement that waited for the row lock, or was descheduled,
--    behind later ones would otherwise decide at a time already behind the key's tat, and
--    refuse a request that is due. (Any decision time keeps the bound: tat only grows, by the
--    cost of each request allowed, and never beyond t + tolerance.)
--  * Concurrent requests of a key are decided one after the other, under its row lock.
--  * A refused request writes the row too (allowed = false, tat unchanged; a HOT update), so
--    that RETURNING tells the two apart. at is the decision's time.
--  * The commit: $4 false (the default) sets synchronous_commit off for this statement's own
--    transaction (set_config(..., true) lasts until its commit), so the decision returns
--    without waiting for the WAL flush; a crash of the server forgets at most the decisions
--    of the last moments (about 3 x wal_writer_delay), whose keys get back the room those
--    took (a decision guards no token, lease or fence). $4 true (WithDurableDecisions) keeps the session's
--    setting, raised to on when it is off, as fencelock.next_token does, so the decision is
--    durable when it returns. set_config runs beside clock_timestamp(), in the sub-select that
--    reads t once the row is locked: once per decision, before the commit, and not at all
--    when the key has no row (then nothing is written and nothing commits). A sub-select whose
--    output has a volatile function is neither pulled up nor pruned of an unused column, so
--    the planner keeps it; and it adds no join to the plan (an index scan and the sub-plan).
UPDATE fencelock.rate_limits AS r
SET (tat, allowed, decided_at) = (
    SELECT CASE WHEN d.base + $3::interval <= d.t THEN d.base + $2::interval ELSE r.tat END,
           d.base + $3::interval <= d.t, d.t
    FROM (SELECT x.t, greatest(r.tat, x.t) AS base
          FROM (SELECT clock_timestamp() AS t,
                       set_config('synchronous_commit',
                                  CASE WHEN NOT $4::boolean THEN 'off'
                                       WHEN current_setting('synchronous_commit') = 'off' THEN 'on'
                                       ELSE current_setting('synchronous_commit') END, true) AS sync_commit) AS x) AS d)
WHERE r.key = $1::text
RETURNING r.tat, r.allowed, r.decided_at AS at;

-- name: RateCreate :exec
-- Creates the row of @key for its first request, as a full bucket (tat -infinity: the same
-- as no row), when it has none; the caller then runs RateAllow, which decides. So the GCRA
-- decision is written once, in RateAllow. Committed with synchronous_commit off whatever the
-- limiter's mode: a row lost in a crash is a full bucket, as this row is, and a durable
-- decision's commit flushes the WAL of this insert with its own.
INSERT INTO fencelock.rate_limits (key, tat, allowed, decided_at)
SELECT sqlc.arg(key)::text, '-infinity', false, '-infinity'
FROM (SELECT set_config('synchronous_commit', 'off', true) AS sync_commit) AS cfg
ON CONFLICT (key) DO NOTHING;

-- name: RateReset :execrows
-- Forgets the state of @key: its next request finds a full bucket.
DELETE FROM fencelock.rate_limits AS r WHERE r.key = sqlc.arg(key)::text;

-- name: RateSweep :execrows
-- Deletes the keys whose tat passed more than @grace_us microseconds ago: idle keys, whose
-- bucket is full (the same as no row). The row lock makes the check see a request that just
-- moved tat (DELETE rechecks its WHERE on the latest version).
DELETE FROM fencelock.rate_limits AS r
WHERE r.tat < clock_timestamp() - sqlc.arg(grace_us)::bigint::float8 * interval '1 microsecond';
