-- name: RateAllow :one
-- One request of cost @cost_us (n x the emission interval, in microseconds) against the GCRA
-- state of @key, with tolerance @tolerance_us (burst x the emission interval), in one
-- statement on the database clock (migration 00009): allowed when
-- greatest(tat, now) + cost - tolerance <= now, and then tat moves to greatest(tat, now) + cost.
-- The first request of a key creates its row (allowed: the caller checks cost <= tolerance).
-- ON CONFLICT locks the row and evaluates SET on its latest version, so concurrent requests of
-- a key are decided one after the other. A refused request writes the row too (allowed =
-- false; tat unchanged), so that RETURNING tells the two apart with the tat they saw. at is
-- now(), the decision's time on the database clock.
INSERT INTO fencelock.rate_limits AS r (key, tat, allowed)
VALUES (sqlc.arg(key)::text, now() + sqlc.arg(cost_us)::bigint * interval '1 microsecond', true)
ON CONFLICT (key) DO UPDATE
SET tat = CASE WHEN greatest(r.tat, now()) + (sqlc.arg(cost_us)::bigint - sqlc.arg(tolerance_us)::bigint) * interval '1 microsecond' <= now()
               THEN greatest(r.tat, now()) + sqlc.arg(cost_us)::bigint * interval '1 microsecond'
               ELSE r.tat END,
    allowed = greatest(r.tat, now()) + (sqlc.arg(cost_us)::bigint - sqlc.arg(tolerance_us)::bigint) * interval '1 microsecond' <= now()
RETURNING r.tat, r.allowed, now()::timestamptz AS at;

-- name: RateReset :execrows
-- Forgets the state of @key: its next request finds a full bucket.
DELETE FROM fencelock.rate_limits AS r WHERE r.key = sqlc.arg(key)::text;

-- name: RateSweep :execrows
-- Deletes the keys whose tat passed more than @grace_us microseconds ago: idle keys, whose
-- bucket is full (the same as no row).
DELETE FROM fencelock.rate_limits AS r
WHERE r.tat < now() - sqlc.arg(grace_us)::bigint * interval '1 microsecond';
