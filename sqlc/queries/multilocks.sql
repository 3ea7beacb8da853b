-- name: LeaseGrantAll :many
-- Grants every lease of @names to @holder for @ttl_us microseconds, all or nothing, in one call:
-- fencelock.grant_all (migration 00010). One row per member granted, or one row with name ''
-- and token 0 when refused (remaining_us: until the first held member expires; 0 unknown).
SELECT coalesce(g.name, '')::text AS name, g.token::bigint AS token,
       coalesce(g.expires_at, clock_timestamp())::timestamptz AS expires_at, g.remaining_us::bigint AS remaining_us
FROM fencelock.grant_all(sqlc.arg(names)::text[], sqlc.arg(holder)::text, sqlc.arg(ttl_us)::bigint) AS g;
