-- name: LeaseAcquire :one
-- One attempt of a waiting Acquire (TryAcquire runs LeaseGrant), with
-- the queue of waiters (migrations/00004_lease_queue.sql), in one statement:
--  * mine: a release handed the lease to this wait before this statement (the grant is current,
--    and its token is the one the wait's row records; outcome 2). A grant of this holder with
--    any other token is an earlier grant (lost by its trust window, say) and is never taken
--    up again: its token is not this wait's; the wait queues behind it like anyone.
--  * ahead: 1 when a live waiter is ahead of this wait (@wait_id, when it is in the queue), or
--    when any live waiter of another holder is queued (a wait not in the queue yet); else 0.
--    A grant goes to the head only: while anyone waits, a newcomer never barges past the
--    queue. It stops at the first such waiter in seq order (ORDER BY seq LIMIT 1: an index
--    scan of lease_waiters_queue that stops there) instead of counting them: the client needs
--    only whether it is at the head, and a count (or a bitmap scan) read every live row of
--    the queue and every dead version of one that hand-offs leave until a vacuum (issue 31:
--    with 64 waiters of one name the statement took 1.0 ms of server time, 87 us with 16).
--  * granted: the grant of LeaseGrant (same pre-checks, same row lock, same token rule, same
--    start no earlier than the end of the grant it replaces, with nowait and may_insert), only
--    when nobody is ahead (outcome 1). It deletes this holder's queue row: the wait is over.
--  * queued: when not granted, joins the queue or refreshes this wait's row
--    (its liveness, now() + @live_us microseconds). A refresh of the same wait keeps its place;
--    a new wait, or a wait whose row expired (it left the queue), joins at the back. When a
--    release handed the lease to this wait after this statement's snapshot, the refresh meets
--    the head's row as the release left it (the upsert locks it and reads its latest version)
--    and returns the handed token instead (outcome 3), without joining again (outcome 4: queued).
--  * relaxed: a statement that granted nothing commits with synchronous_commit off: a queue row
--    lost in a crash costs the waiter one refresh. A grant keeps next_token's raise to on.
-- server_now is clock_timestamp() (read during the statement, so after the client sent it:
-- the client maps database times to its own clock with it); remaining_us is the current
-- grant's remaining TTL in the snapshot (0 when free or unknown); ahead is 1 when a live waiter
-- is ahead, else 0; joined says this statement gave the wait a new place (at the back).
WITH mine AS MATERIALIZED (
    SELECT l.token, l.expires_at FROM fencelock.leases AS l
    JOIN fencelock.lease_waiters AS w ON w.name = l.name AND w.holder = l.holder AND w.granted_token = l.token
    WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
      AND w.wait_id = sqlc.arg(wait_id)::bigint AND l.expires_at > clock_timestamp()
), me AS MATERIALIZED (
    SELECT w.seq FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder = sqlc.arg(holder)::text
      AND w.wait_id = sqlc.arg(wait_id)::bigint
      AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
), ahead AS MATERIALIZED (
    SELECT count(*) AS n FROM (
        SELECT FROM fencelock.lease_waiters AS w
        WHERE w.name = sqlc.arg(name)::text AND w.holder <> sqlc.arg(holder)::text
          AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
          AND w.seq < coalesce((SELECT me.seq FROM me), 9223372036854775807)
        ORDER BY w.seq LIMIT 1) AS a
), granted AS (
    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)
    SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text,
           CASE WHEN EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text)
                THEN 0 ELSE fencelock.next_token(false) END,
           now(), now() + sqlc.arg(ttl_us)::bigint::float8 * interval '1 microsecond'
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
            acquired_at = greatest(excluded.acquired_at, l.expires_at),
            expires_at = greatest(excluded.acquired_at, l.expires_at) + (excluded.expires_at - excluded.acquired_at)
        WHERE l.expires_at <= clock_timestamp()
    RETURNING l.token, l.expires_at
), left_queue AS (
    DELETE FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder = sqlc.arg(holder)::text
      AND EXISTS (SELECT 1 FROM granted)
), queued AS (
    INSERT INTO fencelock.lease_waiters AS w (name, holder, wait_id, seq, channel, ttl_us, since, expires_at)
    SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text, sqlc.arg(wait_id)::bigint,
           nextval('fencelock.lease_waiters_seq'::regclass), nullif(sqlc.arg(channel)::text, ''),
           sqlc.arg(ttl_us)::bigint, now(), now() + sqlc.arg(live_us)::bigint::float8 * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT 1 FROM mine) AND NOT EXISTS (SELECT 1 FROM granted)
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
    RETURNING w.granted_token, w.granted_expires_at, w.since = now() AS joined
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
       coalesce((SELECT greatest(0, (extract(epoch FROM cur.expires_at - clock_timestamp()) * 1000000.0)::bigint)
                 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text), 0)::bigint AS remaining_us,
       (SELECT ahead.n FROM ahead)::bigint AS ahead,
       coalesce((SELECT q.joined FROM queued AS q), false)::boolean AS joined,
       (SELECT count(*) FROM relaxed)::bigint AS relaxed;

-- name: LeaseRelease :one
-- Ends the grant (name, holder, token) now and, when someone waits for the name, hands the
-- lease to the head of the queue in the same statement: one commit for the release and the
-- next grant, and one NOTIFY, to the head's channel only. Scoped to (name, holder, token), so a
-- late release from an old holder never frees or hands over a newer grant; released = 0 means
-- the grant had already expired or been taken over.
--  * The probe for a waiter is the first live row of the name's queue in seq order (ORDER BY
--    seq LIMIT 1, a scalar subquery: EXISTS would drop the order), so that the plan is an
--    index scan of lease_waiters_queue that stops at the head. As an EXISTS the planner chose
--    a bitmap scan, which reads every index entry of the name and every heap page they point
--    to, the dead versions that each hand-off leaves until a vacuum included (issue 31: a hot
--    name with 64 waiters).
--  * Nobody waits (in the statement's snapshot): released is the one UPDATE of the grant's
--    expiry a release always was, with no lock taken beforehand and no statement on the
--    queue, committed with synchronous_commit off: a release lost in a crash keeps the name
--    held until its TTL ends, which is only later, never unsafe. (A waiter that joined after
--    the snapshot is not seen here: see queueWait.)
--  * Someone waits: released updates nothing, and fencelock.hand_off (migration 00004) ends
--    the grant and hands it over under the row locks a grant needs (outcome: 0 not current, 1
--    released without a hand-off, 2 handed, 3 handed and woken). Its token makes the commit
--    synchronous again (next_token raises synchronous_commit to on).
WITH released AS (
    UPDATE fencelock.leases AS l
    SET expires_at = clock_timestamp()
    FROM (SELECT set_config('synchronous_commit', 'off', true) AS sync_commit) AS cfg
    WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
      AND l.token = sqlc.arg(token)::bigint AND l.expires_at > clock_timestamp()
      AND (SELECT w.seq FROM fencelock.lease_waiters AS w
           WHERE w.name = sqlc.arg(name)::text AND w.holder <> sqlc.arg(holder)::text
             AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
           ORDER BY w.seq LIMIT 1) IS NULL
    RETURNING l.name
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM released) THEN 1
            ELSE fencelock.hand_off(sqlc.arg(name)::text, sqlc.arg(holder)::text, sqlc.arg(token)::bigint)
       END::integer AS outcome;

-- name: LeaseLeaveQueue :one
-- Takes @holder's place out of the queue of @name (a waiter that gave up, or a RunLocked that
-- ran), whatever wait id it has (the caller holds the name's gate and has no other wait on
-- that name, so an earlier id of the same wait is included), and returns the token a release handed to it meanwhile (0: none), which the caller
-- then releases with LeaseRelease, handing it to the next waiter, unless it holds that grant. When the lease is
-- free, it wakes the next head (token 0 in the payload): a release that found this wait at the
-- head woke only it. Committed with synchronous_commit off, as a refused attempt is.
WITH gone AS (
    DELETE FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder = sqlc.arg(holder)::text
    RETURNING w.granted_token
), relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS sync_commit
), woken AS MATERIALIZED (
    SELECT pg_notify(h.channel, concat_ws(' ', h.wait_id, 0, 0, octet_length(h.holder), h.holder || sqlc.arg(name)::text)) AS sent
    FROM (SELECT w.holder, w.wait_id, w.channel FROM fencelock.lease_waiters AS w
          WHERE w.name = sqlc.arg(name)::text AND w.holder <> sqlc.arg(holder)::text
            AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
          ORDER BY w.seq LIMIT 1) AS h
    WHERE h.channel IS NOT NULL AND EXISTS (SELECT 1 FROM gone)
      AND NOT EXISTS (SELECT 1 FROM fencelock.leases AS l
                      WHERE l.name = sqlc.arg(name)::text AND l.expires_at > clock_timestamp())
)
SELECT coalesce((SELECT g.granted_token FROM gone AS g), 0)::bigint AS granted_token,
       (SELECT count(*) FROM relaxed)::bigint AS relaxed,
       (SELECT count(*) FROM woken)::bigint AS woken;

-- name: LeaseJoinQueue :one
-- Joins the queue of @name, or refreshes this wait's place (@wait_id), for a RunLocked that
-- was refused: a row with ttl_us 0, which a release does not hand a TTL grant to but wakes to
-- take the free lease in its own transaction (LeaseGrant lets the head of the queue through).
-- Same rules of place and liveness as LeaseAcquire's queued (a grant handed to the same wait,
-- shared with an Acquire of the same lessor, is kept for it, and so is the TTL that Acquire
-- asked for); committed with synchronous_commit off. Returns what LeaseAcquire returns for a
-- refusal.
WITH me AS MATERIALIZED (
    SELECT w.seq FROM fencelock.lease_waiters AS w
    WHERE w.name = sqlc.arg(name)::text AND w.holder = sqlc.arg(holder)::text
      AND w.wait_id = sqlc.arg(wait_id)::bigint AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
), ahead AS MATERIALIZED (
    SELECT count(*) AS n FROM (
        SELECT FROM fencelock.lease_waiters AS w
        WHERE w.name = sqlc.arg(name)::text AND w.holder <> sqlc.arg(holder)::text
          AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
          AND w.seq < coalesce((SELECT me.seq FROM me), 9223372036854775807)
        ORDER BY w.seq LIMIT 1) AS a
), queued AS (
    INSERT INTO fencelock.lease_waiters AS w (name, holder, wait_id, seq, channel, ttl_us, since, expires_at)
    VALUES (sqlc.arg(name)::text, sqlc.arg(holder)::text, sqlc.arg(wait_id)::bigint,
            nextval('fencelock.lease_waiters_seq'::regclass), nullif(sqlc.arg(channel)::text, ''), 0, now(),
            now() + sqlc.arg(live_us)::bigint::float8 * interval '1 microsecond')
    ON CONFLICT (name, holder) DO UPDATE
        SET seq = CASE WHEN w.wait_id = excluded.wait_id AND (w.granted_token <> 0 OR w.expires_at > clock_timestamp())
                       THEN w.seq ELSE excluded.seq END,
            since = CASE WHEN w.wait_id = excluded.wait_id AND (w.granted_token <> 0 OR w.expires_at > clock_timestamp())
                         THEN w.since ELSE excluded.since END,
            expires_at = CASE WHEN w.wait_id = excluded.wait_id AND w.granted_token <> 0
                              THEN w.expires_at ELSE excluded.expires_at END,
            granted_token = CASE WHEN w.wait_id = excluded.wait_id THEN w.granted_token ELSE 0 END,
            granted_expires_at = CASE WHEN w.wait_id = excluded.wait_id THEN w.granted_expires_at END,
            wait_id = excluded.wait_id, channel = excluded.channel,
            ttl_us = CASE WHEN w.wait_id = excluded.wait_id THEN w.ttl_us ELSE 0 END
    RETURNING w.since = now() AS joined
), relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true) AS sync_commit
)
SELECT coalesce((SELECT q.joined FROM queued AS q), false)::boolean AS joined,
       (SELECT ahead.n FROM ahead)::bigint AS ahead,
       coalesce((SELECT greatest(0, (extract(epoch FROM cur.expires_at - clock_timestamp()) * 1000000.0)::bigint)
                 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text), 0)::bigint AS remaining_us,
       (SELECT count(*) FROM relaxed)::bigint AS relaxed;

-- name: LeaseWaitersSweep :execrows
-- Deletes the queue rows that left the queue (expired, or handed a grant) more than @grace_us
-- microseconds ago on the database clock. Rows locked by anyone are skipped.
DELETE FROM fencelock.lease_waiters AS w
WHERE (w.name, w.holder) IN (
    SELECT d.name, d.holder FROM fencelock.lease_waiters AS d
    WHERE d.expires_at < clock_timestamp() - sqlc.arg(grace_us)::bigint::float8 * interval '1 microsecond'
    FOR UPDATE SKIP LOCKED);
