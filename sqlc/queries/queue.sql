-- name: LeaseAcquire :one
-- One attempt of a TTL grant (Lessor.TryAcquire, and each attempt of a waiting Acquire), with
-- the queue of waiters (migrations/00004_lease_queue.sql), in one statement:
--  * mine: the name is already held by @holder, unexpired: a release handed it to this holder's
--    wait before this statement (outcome 2). Nothing is written.
--  * ahead: the live waiters ahead of this wait (@wait_id, when it is in the queue), or all live
--    waiters of other holders (a try, @wait_id = 0, or a wait not in the queue yet). A grant
--    goes to the head only: while anyone waits, a newcomer never barges past the queue.
--  * granted: the grant of LeaseGrant (same pre-checks, same row lock, same token rule, with
--    nowait and may_insert), only when nobody is ahead (outcome 1). It deletes this holder's
--    queue row: the wait is over.
--  * queued: when not granted and @wait_id <> 0, joins the queue or refreshes this wait's row
--    (its liveness, now() + @live_us microseconds). A refresh of the same wait keeps its place;
--    a new wait, or a wait whose row expired (it left the queue), joins at the back. When a
--    release handed the lease to this wait after this statement's snapshot, the refresh meets
--    the head's row as the release left it (the upsert locks it and reads its latest version)
--    and returns the handed token instead (outcome 3), without joining again (outcome 4: queued).
--  * relaxed: a statement that granted nothing commits with synchronous_commit off: a queue row
--    lost in a crash costs the waiter one refresh. A grant keeps next_token's raise to on.
-- server_now is clock_timestamp() (read during the statement, so after the client sent it:
-- the client maps database times to its own clock with it); remaining_us is the current
-- grant's remaining TTL in the snapshot (0 when free or unknown); ahead counts the live
-- waiters ahead.
WITH mine AS MATERIALIZED (
    SELECT l.token, l.expires_at FROM fencelock.leases AS l
    WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
      AND l.token > 0 AND l.expires_at > clock_timestamp()
), me AS MATERIALIZED (
    SELECT w.seq FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder = sqlc.arg(holder)::text
      AND w.wait_id = sqlc.arg(wait_id)::bigint AND sqlc.arg(wait_id)::bigint <> 0
      AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
), ahead AS MATERIALIZED (
    SELECT count(*) AS n FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder <> sqlc.arg(holder)::text
      AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
      AND w.seq < coalesce((SELECT me.seq FROM me), 9223372036854775807)
), granted AS (
    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)
    SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text, fencelock.next_token(false), now(),
           now() + sqlc.arg(ttl_us)::bigint * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT 1 FROM mine)
      AND (SELECT ahead.n FROM ahead) = 0
      AND NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur
                      WHERE cur.name = sqlc.arg(name)::text AND cur.expires_at > clock_timestamp())
      AND (NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text)
           OR EXISTS (SELECT 1 FROM fencelock.leases AS cur
                      WHERE cur.name = sqlc.arg(name)::text AND cur.expires_at <= clock_timestamp()
                      FOR UPDATE SKIP LOCKED))
    ON CONFLICT (name) DO UPDATE
        SET name = excluded.name, holder = excluded.holder, token = fencelock.next_token(false),
            acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
        WHERE l.expires_at <= clock_timestamp()
    RETURNING l.token, l.expires_at
), left_queue AS (
    DELETE FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder = sqlc.arg(holder)::text
      AND EXISTS (SELECT 1 FROM granted)
), queued AS (
    INSERT INTO fencelock.lease_waiters AS w (name, holder, wait_id, seq, channel, ttl_us, since, expires_at)
    SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text, sqlc.arg(wait_id)::bigint,
           nextval('fencelock.lease_waiters_seq'), nullif(sqlc.arg(channel)::text, ''),
           sqlc.arg(ttl_us)::bigint, now(), now() + sqlc.arg(live_us)::bigint * interval '1 microsecond'
    WHERE sqlc.arg(wait_id)::bigint <> 0 AND NOT EXISTS (SELECT 1 FROM mine)
      AND NOT EXISTS (SELECT 1 FROM granted)
    ON CONFLICT (name, holder) DO UPDATE
        SET seq = CASE WHEN w.wait_id = excluded.wait_id AND (w.granted_token <> 0 OR w.expires_at > clock_timestamp())
                       THEN w.seq ELSE excluded.seq END,
            since = CASE WHEN w.wait_id = excluded.wait_id AND (w.granted_token <> 0 OR w.expires_at > clock_timestamp())
                         THEN w.since ELSE excluded.since END,
            expires_at = CASE WHEN w.wait_id = excluded.wait_id AND w.granted_token <> 0
                              THEN w.expires_at ELSE excluded.expires_at END,
            granted_token = CASE WHEN w.wait_id = excluded.wait_id THEN w.granted_token ELSE 0 END,
            granted_expires_at = CASE WHEN w.wait_id = excluded.wait_id THEN w.granted_expires_at END,
            wait_id = excluded.wait_id, channel = excluded.channel, ttl_us = excluded.ttl_us
    RETURNING w.granted_token, w.granted_expires_at
), relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS sync_commit
    WHERE NOT EXISTS (SELECT 1 FROM granted)
)
SELECT (CASE WHEN EXISTS (SELECT 1 FROM granted) THEN 1
             WHEN EXISTS (SELECT 1 FROM mine) THEN 2
             WHEN coalesce((SELECT q.granted_token FROM queued AS q), 0) <> 0 THEN 3
             WHEN EXISTS (SELECT 1 FROM queued) THEN 4
             ELSE 0 END)::integer AS outcome,
       coalesce((SELECT g.token FROM granted AS g), (SELECT m.token FROM mine AS m),
                (SELECT q.granted_token FROM queued AS q), 0)::bigint AS token,
       coalesce((SELECT g.expires_at FROM granted AS g), (SELECT m.expires_at FROM mine AS m),
                (SELECT q.granted_expires_at FROM queued AS q), clock_timestamp())::timestamptz AS expires_at,
       clock_timestamp()::timestamptz AS server_now,
       coalesce((SELECT greatest(0, (extract(epoch FROM cur.expires_at - clock_timestamp()) * 1000000)::bigint)
                 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text), 0)::bigint AS remaining_us,
       (SELECT ahead.n FROM ahead)::bigint AS ahead,
       (SELECT count(*) FROM relaxed)::bigint AS relaxed;

-- name: LeaseRelease :one
-- Ends the grant (name, holder, token) now and, when someone waits for the name, hands the
-- lease to the head of the queue in the same statement: one commit for the release and the
-- next grant, and one NOTIFY, to the head's channel only. Scoped to (name, holder, token), so a
-- late release from an old holder never frees or hands over a newer grant; released = 0 means
-- the grant had already expired or been taken over.
--
-- Why it is safe:
--  * cur locks the lease row FOR NO KEY UPDATE, as a renewal does: it does not wait for the
--    holder's own guarded transactions (FOR KEY SHARE).
--  * The hand-off is a grant and needs what LeaseGrant needs: the row FOR UPDATE, which conflicts
--    with FOR KEY SHARE, so no hand-off commits before a guarded transaction of this holder
--    still open. free takes that lock with SKIP LOCKED: with a guarded transaction open (a
--    Release from inside it, say) the lease is released without a hand-off and the head is
--    woken (token 0 in the payload) to grant itself, which waits for the guard. Never a wait
--    on the holder's own transaction.
--  * The token is drawn by next_token under the row lock, after the holder's grant committed:
--    larger than every earlier token of the name. It is durable when the release commits
--    (next_token raises synchronous_commit to on; the statement writes the lease row).
--  * The head is the live waiter with the smallest seq; its row is locked (lease row first,
--    then the waiter row: the order of LeaseAcquire too, so the two never deadlock). The
--    handed grant expires at now() + the TTL the waiter asked for; the waiter's row keeps the
--    token and expiry, so a refresh or a poll of that waiter finds it.
--  * Without a waiter the release commits with synchronous_commit off: a release lost in a
--    crash keeps the name held until its TTL ends, which is safe (only later).
-- The payload is "<wait_id> <token> <expires_at, µs since the Unix epoch> <name>".
WITH cur AS MATERIALIZED (
    SELECT l.name FROM fencelock.leases AS l
    WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
      AND l.token = sqlc.arg(token)::bigint AND l.expires_at > clock_timestamp()
    FOR NO KEY UPDATE
), head AS MATERIALIZED (
    SELECT w.holder, w.wait_id, w.channel, w.ttl_us FROM fencelock.lease_waiters AS w
    WHERE EXISTS (SELECT 1 FROM cur) AND w.name = sqlc.arg(name)::text
      AND w.holder <> sqlc.arg(holder)::text AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
    ORDER BY w.seq
    LIMIT 1
    FOR UPDATE
), free AS MATERIALIZED (
    SELECT l.name FROM fencelock.leases AS l
    WHERE EXISTS (SELECT 1 FROM head) AND l.name = sqlc.arg(name)::text
    FOR UPDATE SKIP LOCKED
), next AS MATERIALIZED (
    SELECT head.holder, head.ttl_us, fencelock.next_token(false) AS token FROM head, free
), handed AS (
    UPDATE fencelock.leases AS l
    SET name = l.name, holder = next.holder, token = next.token, acquired_at = now(),
        expires_at = now() + next.ttl_us * interval '1 microsecond'
    FROM next
    WHERE l.name = sqlc.arg(name)::text
    RETURNING l.token, l.expires_at
), released AS (
    UPDATE fencelock.leases AS l
    SET expires_at = clock_timestamp()
    FROM cur
    WHERE l.name = cur.name AND NOT EXISTS (SELECT 1 FROM next)
    RETURNING l.name
), head_granted AS (
    UPDATE fencelock.lease_waiters AS w
    SET granted_token = h.token, granted_expires_at = h.expires_at, expires_at = clock_timestamp()
    FROM handed AS h, head
    WHERE w.name = sqlc.arg(name)::text AND w.holder = head.holder
), woken AS MATERIALIZED (
    SELECT pg_notify(head.channel, concat_ws(' ', head.wait_id, coalesce(h.token, 0),
                     coalesce((extract(epoch FROM h.expires_at) * 1000000)::bigint, 0), sqlc.arg(name)::text)) AS sent
    FROM head LEFT JOIN handed AS h ON true
    WHERE head.channel IS NOT NULL
), relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS sync_commit
    WHERE NOT EXISTS (SELECT 1 FROM next)
)
SELECT ((SELECT count(*) FROM handed) + (SELECT count(*) FROM released))::bigint AS released,
       (SELECT count(*) FROM handed)::bigint AS handed,
       (SELECT count(*) FROM woken)::bigint AS woken,
       (SELECT count(*) FROM relaxed)::bigint AS relaxed;

-- name: LeaseLeaveQueue :one
-- Takes the wait @wait_id of @holder out of the queue of @name (a waiter that gave up), and
-- returns the token a release handed to it meanwhile (0: none), which the caller then releases
-- with LeaseRelease, handing it to the next waiter. Committed with synchronous_commit off, as a
-- refused attempt is.
WITH gone AS (
    DELETE FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder = sqlc.arg(holder)::text
      AND w.wait_id = sqlc.arg(wait_id)::bigint
    RETURNING w.granted_token
), relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS sync_commit
)
SELECT coalesce((SELECT g.granted_token FROM gone AS g), 0)::bigint AS granted_token,
       (SELECT count(*) FROM relaxed)::bigint AS relaxed;

-- name: LeaseWaitersSweep :execrows
-- Deletes the queue rows that left the queue (expired, or handed a grant) more than @grace_us
-- microseconds ago on the database clock. Rows locked by anyone are skipped.
DELETE FROM fencelock.lease_waiters AS w
WHERE (w.name, w.holder) IN (
    SELECT d.name, d.holder FROM fencelock.lease_waiters AS d
    WHERE d.expires_at < clock_timestamp() - sqlc.arg(grace_us)::bigint * interval '1 microsecond'
    FOR UPDATE SKIP LOCKED);
