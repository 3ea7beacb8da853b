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
UPDATE fencelock.rate_limits AS r
SET (tat, allowed, decided_at) = (
    SELECT CASE WHEN d.base + $3::interval <= d.t THEN d.base + $2::interval ELSE r.tat END,
           d.base + $3::interval <= d.t, d.t
    FROM (SELECT x.t, greatest(r.tat, x.t) AS base FROM (SELECT clock_timestamp() AS t) AS x) AS d)
WHERE r.key = $1::text
RETURNING r.tat, r.allowed, r.decided_at AS at;

-- name: RateCreate :exec
-- Creates the row of @key for its first request, as a full bucket (tat -infinity: the same
-- as no row), when it has none; the caller then runs RateAllow, which decides. So the GCRA
-- decision is written once, in RateAllow.
INSERT INTO fencelock.rate_limits (key, tat, allowed, decided_at)
VALUES (sqlc.arg(key)::text, '-infinity', false, '-infinity')
ON CONFLICT (key) DO NOTHING;

-- name: RateReset :execrows
-- Forgets the state of @key: its next request finds a full bucket.
DELETE FROM fencelock.rate_limits AS r WHERE r.key = sqlc.arg(key)::text;

-- name: RateSweep :execrows
-- Deletes the keys whose tat passed more than @grace_us microseconds ago: idle keys, whose
-- bucket is full (the same as no row). The row lock makes the check see a request that just
-- moved tat (DELETE rechecks its WHERE on the latest version).
DELETE FROM fencelock.rate_limits AS r
WHERE r.tat < clock_timestamp() - sqlc.arg(grace_us)::bigint * interval '1 microsecond';
