-- name: SemaphoreAcquire :one
-- One attempt at a permit of @sem for @holder: fencelock.semaphore_acquire (migrations 00012,
-- 00015). Outcome 1: granted (name is the permit's lease name); 3: a release gave this wait a
-- permit (name); 4: refused (queued when @queue). Refused with ahead -1: nothing decided, look
-- again at once (a release is giving this wait a permit, or another attempt is creating the
-- semaphore's row or counting its permits: this one waits for no other's lock).
SELECT s.outcome::integer AS outcome, coalesce(s.name, '')::text AS name, s.token::bigint AS token,
       coalesce(s.expires_at, s.server_now)::timestamptz AS expires_at, s.server_now::timestamptz AS server_now,
       s.ahead::bigint AS ahead, s.remaining_us::bigint AS remaining_us, s.permit_limit::integer AS permit_limit
FROM fencelock.semaphore_acquire(sqlc.arg(sem)::text, sqlc.arg(holder)::text, sqlc.arg(wait_id)::bigint,
    sqlc.arg(ttl_us)::bigint, sqlc.arg(default_limit)::integer, sqlc.arg(queue)::boolean,
    sqlc.arg(channel)::text, sqlc.arg(live_us)::bigint) AS s;

-- name: SemaphoreRelease :one
-- Ends the permit (@slot, @holder, @token) of @sem and gives it to the head of the queue, or
-- frees it: fencelock.semaphore_release (migration 00012; 0: not current, 1: released and
-- freed, 2: given to a waiter that polls, or freed and a waiter woken, 3: given and notified).
-- With fencelock.defer_notify on, a hand-off's NOTIFY is not sent here: notify_channel and
-- notify_payload carry it ('' when none), for SemaphoreNotify once this has committed.
WITH cfg AS MATERIALIZED (
    SELECT set_config('fencelock.defer_notify', 'on', true) AS defer,
           set_config('fencelock.deferred_notify', '', true) AS pending
), r AS MATERIALIZED (
    SELECT fencelock.semaphore_release(sqlc.arg(sem)::text, sqlc.arg(slot)::text, sqlc.arg(holder)::text, sqlc.arg(token)::bigint) AS outcome
    FROM cfg
)
SELECT r.outcome::integer AS outcome,
       split_part(coalesce(current_setting('fencelock.deferred_notify', true), ''), ' ', 1)::text AS notify_channel,
       substr(coalesce(current_setting('fencelock.deferred_notify', true), ''),
              length(split_part(coalesce(current_setting('fencelock.deferred_notify', true), ''), ' ', 1)) + 2)::text AS notify_payload
FROM r;

-- name: SemaphoreNotify :exec
-- Sends a hand-off's NOTIFY that SemaphoreRelease left to its caller, in a transaction of its
-- own committed without waiting for a flush (the hand-off it announces is durable already):
-- PostgreSQL's lock on notifying commits is then held for microseconds, not for a flush.
SELECT set_config('synchronous_commit', 'off', true), pg_notify(sqlc.arg(channel)::text, sqlc.arg(payload)::text);

-- name: SemaphoreLeave :one
-- Takes the wait @wait_id out of the queue of @sem (a waiter that gave up), hands on a permit a
-- release gave that wait meanwhile, and wakes the next waiter if it was there and held none:
-- fencelock.semaphore_leave (migration 00012). Returns how many permits it handed on.
SELECT fencelock.semaphore_leave(sqlc.arg(sem)::text, sqlc.arg(wait_id)::bigint, sqlc.arg(holder)::text)::integer AS handed_on;

-- name: SemaphoreReleaseUnknown :one
-- Ends the permit of @sem granted to @holder for the wait @wait_id, if any: after a grant
-- attempt whose outcome is unknown (its connection was abandoned mid-flight). That permit was
-- never handed to a caller (the attempt did not return it), and another attempt of the same
-- lessor, granted just then, has a wait of its own. Each permit ended goes on to the head of
-- the queue, or to the free set (fencelock.semaphore_release). One index probe
-- (leases.permit_wait), whatever the limit. Returns how many it ended and how many of them it
-- gave to a waiter.
SELECT count(*)::bigint AS ended, count(*) FILTER (WHERE r.outcome >= 2)::bigint AS woken
FROM (SELECT fencelock.semaphore_release(sqlc.arg(sem)::text, l.name, l.holder, l.token) AS outcome
      FROM fencelock.leases AS l
      WHERE l.permit_wait = sqlc.arg(wait_id)::bigint AND l.holder = sqlc.arg(holder)::text
        AND l.name LIKE sqlc.arg(sem)::text || '#%' AND l.expires_at > clock_timestamp()) AS r;

-- name: SemaphoreSetLimit :one
-- Sets the limit of @sem (fencelock.semaphore_set_limit); returns the previous one (0: new).
SELECT fencelock.semaphore_set_limit(sqlc.arg(sem)::text, sqlc.arg(permit_limit)::integer)::integer AS previous;

-- name: SemaphoreState :one
-- The limit of @sem, its permits unexpired now and its live waiters (fencelock.semaphore_state).
SELECT s.permit_limit::integer AS permit_limit, s.held::bigint AS held, s.waiting::bigint AS waiting
FROM fencelock.semaphore_state AS s
WHERE s.name = sqlc.arg(sem)::text;

-- name: SemaphoreWaitersSweep :execrows
-- Deletes waiter rows expired more than @grace_us microseconds ago.
DELETE FROM fencelock.semaphore_waiters AS w
WHERE w.expires_at < clock_timestamp() - sqlc.arg(grace_us)::bigint::float8 * interval '1 microsecond';
