-- name: LeaseGrant :one
-- Grants the lease named @name to @holder when its row is absent or expired on the database
-- clock, in one statement; returns no row when someone else holds it.
--
-- Why it is safe:
--  * ON CONFLICT DO UPDATE locks the existing row before it evaluates the WHERE, so two grants
--    of one name are serialised by the row lock and the second sees the first's expires_at.
--  * token = DEFAULT draws nextval() under that row lock, after every earlier grant of the name
--    committed, so tokens for a name rise strictly in grant order (and never repeat: one
--    sequence serves all names). The INSERT path draws one too; a refused grant burns it, so
--    tokens are increasing but not consecutive.
--  * synchronous_commit is forced on for this transaction: with the server default off, a
--    crash could lose the commit and the sequence's WAL and hand the same token out again.
--  * lock_timeout (@lock_timeout, e.g. '10ms'; NULL keeps the session's) bounds the wait for a
--    row held by another transaction (a transaction-scoped holder, a guarded transaction). The
--    previous value is stashed in fencelock.prev_lock_timeout and put back by RETURNING once
--    the row is granted, so a caller's transaction keeps its own setting. (The FROM list is
--    evaluated left to right, before the conflict check takes the row lock.)
--  * @ttl_us is the TTL in microseconds; 0 (transaction-scoped grants) makes the row expire at
--    transaction start, so it is free again as soon as the holding transaction ends.
--  * With @precheck (set by waiters' retries), a NOT EXISTS pre-check (the snapshot's view)
--    refuses a lease that is plainly held without reaching ON CONFLICT, which would lock the
--    holder's row even when its WHERE fails, and so make the holder's SKIP LOCKED renewals skip
--    it while waiters poll. It decides nothing: the WHERE of ON CONFLICT, under the row lock,
--    does. A first attempt skips it: one refusal locks the row for one statement, and the
--    uncontended grant does not pay for the extra index probe.
INSERT INTO fencelock.leases AS l (name, holder, acquired_at, expires_at)
SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text, now(), now() + sqlc.arg(ttl_us)::bigint * interval '1 microsecond'
FROM (SELECT set_config('fencelock.prev_lock_timeout', current_setting('lock_timeout'), true),
             set_config('lock_timeout', coalesce(sqlc.narg(lock_timeout)::text, current_setting('lock_timeout')), true),
             set_config('synchronous_commit', 'on', true)) AS cfg
WHERE NOT sqlc.arg(precheck)::boolean
   OR NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur
                  WHERE cur.name = sqlc.arg(name)::text AND cur.expires_at > clock_timestamp())
ON CONFLICT (name) DO UPDATE
    SET holder = excluded.holder, token = DEFAULT,
        acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
    WHERE l.expires_at <= clock_timestamp()
RETURNING l.token, l.expires_at,
          set_config('lock_timeout', current_setting('fencelock.prev_lock_timeout'), true) AS restored;

-- name: LeaseRemaining :one
-- The current grant's remaining TTL on the database clock, in microseconds (0 when expired).
-- Read only after a refused grant, to time the next attempt.
SELECT greatest(0, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000000)::bigint)::bigint AS remaining_us
FROM fencelock.leases AS l
WHERE l.name = sqlc.arg(name)::text;

-- name: LeaseRenew :many
-- Extends each of @holder's leases given as parallel arrays (@names, @tokens, @ttls_us in
-- microseconds) to now() + its TTL, in one statement for the whole batch.
--
-- Why it is safe:
--  * Scoped to (name, holder, token) and to rows not yet expired on the database clock, so a
--    late renewal can never revive a lapsed lease or touch a newer grant.
--  * Rows locked by someone else (a guarded transaction of the holder's own, holding the row
--    FOR SHARE until it commits) are skipped rather than waited for, so one long transaction
--    cannot hold up the renewal of every other lease in the batch. They come back with
--    renewed = false while the snapshot still shows them current: retry them soon. A lease that
--    comes back neither renewed nor current (or not at all) is lost.
--  * synchronous_commit is forced on: a renewal lost in a crash would let a new holder in while
--    the old one still trusts its renewal.
WITH cfg AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'on', true) AS sync_commit
), v AS (
    SELECT unnest(sqlc.arg(names)::text[]) AS name, unnest(sqlc.arg(tokens)::bigint[]) AS token,
           unnest(sqlc.arg(ttls_us)::bigint[]) AS ttl_us
    FROM cfg
), target AS (
    SELECT l.name, v.ttl_us
    FROM fencelock.leases AS l JOIN v ON l.name = v.name AND l.token = v.token
    WHERE l.holder = sqlc.arg(holder)::text AND l.expires_at > clock_timestamp()
    FOR NO KEY UPDATE OF l SKIP LOCKED
), renewed AS (
    UPDATE fencelock.leases AS l
    SET expires_at = now() + target.ttl_us * interval '1 microsecond'
    FROM target
    WHERE l.name = target.name
    RETURNING l.name, l.token, l.expires_at
)
SELECT r.name::text AS name, r.token::bigint AS token, r.expires_at::timestamptz AS expires_at, true AS renewed
FROM renewed AS r
UNION ALL
SELECT l.name, l.token, l.expires_at, false
FROM fencelock.leases AS l JOIN v ON l.name = v.name AND l.token = v.token
WHERE l.holder = sqlc.arg(holder)::text AND l.expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM renewed WHERE renewed.name = l.name);

-- name: LeaseRelease :execrows
-- Ends a grant now by moving its expiry to the current time. Scoped to (name, holder, token),
-- so a late release from an old holder never frees a newer grant; 0 rows means the grant had
-- already expired or been taken over. The row stays (tokens come from the sequence, not the
-- row), so the next grant of the name is a HOT update. synchronous_commit is forced on, so an
-- acknowledged release is not undone by a crash (which would keep the name held for a TTL).
UPDATE fencelock.leases
SET expires_at = clock_timestamp()
FROM (SELECT set_config('synchronous_commit', 'on', true)) AS cfg
WHERE name = sqlc.arg(name)::text AND holder = sqlc.arg(holder)::text AND token = sqlc.arg(token)::bigint
  AND expires_at > clock_timestamp();

-- name: LeaseReleaseUnknown :execrows
-- Ends any grant of @name to @holder except the tokens in @keep_tokens (the lessor's leases of
-- the name it still believes held). Used after an acquire
-- was cancelled while its grant statement was in flight: the server may have granted it just
-- as the client gave up, and the token is then unknown to the client.
UPDATE fencelock.leases
SET expires_at = clock_timestamp()
WHERE name = sqlc.arg(name)::text AND holder = sqlc.arg(holder)::text
  AND token <> ALL (sqlc.arg(keep_tokens)::bigint[]) AND expires_at > clock_timestamp();

-- name: LeaseGuard :one
-- Checks, inside the caller's transaction, that the grant (name, holder, token) is still
-- current and unexpired on the database clock, and holds the row FOR SHARE until the caller's
-- transaction ends: a takeover updates the row, so it cannot commit before the caller does.
-- (FOR KEY SHARE would not do: a takeover is a non-key update and would not wait for it.)
SELECT l.expires_at
FROM fencelock.leases AS l
WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text AND l.token = sqlc.arg(token)::bigint
  AND l.expires_at > clock_timestamp()
FOR SHARE;
