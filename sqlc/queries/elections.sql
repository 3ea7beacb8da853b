-- name: ElectionProclaim :one
-- Records @value as the value of the term (@name, @holder, @token), provided that term is the
-- current, unexpired grant of @name (locked FOR KEY SHARE, as a guard: a takeover waits for
-- this statement), and wakes the election's observers: NOTIFY fencelock_election with the
-- name as payload. A value of an earlier term never overwrites a later one's. proclaimed is
-- false when the term is no longer current.
WITH cur AS (
    SELECT l.name FROM fencelock.leases AS l
    WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
      AND l.token = sqlc.arg(token)::bigint AND l.expires_at > clock_timestamp()
    FOR KEY SHARE
), upsert AS (
    INSERT INTO fencelock.election_values AS v (name, token, value, proclaimed_at)
    SELECT cur.name, sqlc.arg(token)::bigint, sqlc.arg(value)::text, clock_timestamp() FROM cur
    ON CONFLICT (name) DO UPDATE
        SET token = excluded.token, value = excluded.value, proclaimed_at = excluded.proclaimed_at
        WHERE v.token <= excluded.token
    RETURNING v.name
)
SELECT (EXISTS (SELECT 1 FROM upsert) AND pg_notify('fencelock_election', sqlc.arg(name)::text) IS NOT NULL)::boolean AS proclaimed;

-- name: ElectionNotify :exec
-- Wakes the observers of election @name (after a resign).
SELECT pg_notify('fencelock_election', sqlc.arg(name)::text);

-- name: ElectionLeader :one
-- The current term of election @name: its holder, token, value (NULL until proclaimed) and
-- expiry, with the database clock's reading; no row when nobody leads.
SELECT l.holder, l.token,
       coalesce((SELECT v.value FROM fencelock.election_values AS v WHERE v.name = l.name AND v.token = l.token), '')::text AS value,
       EXISTS (SELECT 1 FROM fencelock.election_values AS v WHERE v.name = l.name AND v.token = l.token) AS proclaimed,
       l.acquired_at, l.expires_at, clock_timestamp()::timestamptz AS server_now
FROM fencelock.leases AS l
WHERE l.name = sqlc.arg(name)::text AND l.token > 0 AND l.expires_at > clock_timestamp();
