-- name: LiveViewSnapshot :one
-- One snapshot of everything the live view (package ui) shows, as one JSON document, so that a
-- poll is one statement whatever the number of pages open. It only reads: tables and views
-- that the read-only role of README's "Least privilege" may SELECT, and pg_locks and
-- pg_stat_activity through fencelock.advisory_locks (open to every role; other roles'
-- sessions' details need pg_read_all_stats). Every list is capped at @max_rows + 1 rows so that
-- the caller can tell a cut list from a full one; a cut list keeps the rows it orders first.
--
-- leases: in the order of the primary key (so a cut list is read from the index, not sorted),
-- every lease row still held, and every row whose grant ended after @since (the
-- previous poll's clock, less a margin), with the values the timeline needs to tell a release
-- (expires_at moved back to the clock of the release) from an expiry (expires_at unchanged) and
-- a forced release (holder 'fencelock force-release'), and whether a release handed the grant
-- to a waiter that has not claimed it yet (handed). The renewal columns count only when
-- they belong to the current token (the view fencelock.holders reads them the same way).
SELECT json_build_object(
    'now', clock_timestamp(),
    'leases', coalesce((
        SELECT json_agg(t ORDER BY t.name) FROM (
            SELECT l.name, l.holder, l.token, l.acquired_at, l.expires_at,
                   CASE WHEN l.renewed_token = l.token THEN l.renewals ELSE 0 END AS renewals,
                   CASE WHEN l.renewed_token = l.token THEN l.renewed_at END AS renewed_at,
                   EXISTS (SELECT 1 FROM fencelock.lease_waiters AS w
                           WHERE w.name = l.name AND w.granted_token = l.token) AS handed
            FROM fencelock.leases AS l
            WHERE l.token > 0 AND l.expires_at > sqlc.arg(since)::timestamptz
            ORDER BY l.name
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json),
    'waiters', coalesce((
        SELECT json_agg(t ORDER BY t.name, t.seq) FROM (
            SELECT w.name, w.holder, w.seq, w.since, w.channel IS NOT NULL AS notify
            FROM fencelock.lease_waiters AS w
            WHERE w.granted_token = 0 AND w.expires_at > clock_timestamp()
            ORDER BY w.name, w.seq
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json),
    'advisory', coalesce((
        SELECT json_agg(t ORDER BY t.key, t.key1, t.key2, t.granted DESC, t.waitstart, t.pid) FROM (
            SELECT a.key, a.key1, a.key2, a.name, a.mode, a.granted, a.pid, a.application_name,
                   host(a.client_addr) AS client_addr, a.backend_start, a.xact_start, a.state,
                   a.waitstart, a.blocked_by
            FROM fencelock.advisory_locks AS a
            ORDER BY a.key, a.key1, a.key2, a.granted DESC, a.waitstart, a.pid
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json),
    'semaphores', coalesce((
        SELECT json_agg(t ORDER BY t.name) FROM (
            SELECT s.name, s.permit_limit,
                   (SELECT coalesce(json_agg(p ORDER BY p.acquired_at), '[]'::json) FROM (
                        SELECT l.name AS slot, l.holder, l.token, l.acquired_at, l.expires_at
                        FROM fencelock.leases AS l
                        WHERE l.name = ANY (fencelock.semaphore_slots(s.name, greatest(s.permit_limit, s.slots)))
                          AND l.token > 0 AND l.expires_at > clock_timestamp()) AS p) AS permits,
                   (SELECT count(*) FROM fencelock.semaphore_waiters AS w
                    WHERE w.semaphore = s.name AND w.expires_at > clock_timestamp()) AS waiting,
                   (SELECT coalesce(json_agg(q ORDER BY q.seq), '[]'::json) FROM (
                        SELECT w.holder, w.seq, w.since
                        FROM fencelock.semaphore_waiters AS w
                        WHERE w.semaphore = s.name AND w.expires_at > clock_timestamp()
                        ORDER BY w.seq
                        LIMIT 20) AS q) AS waiters
            FROM fencelock.semaphores AS s
            ORDER BY s.name
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json),
    'leaders', coalesce((
        SELECT json_agg(t ORDER BY t.name) FROM (
            SELECT v.name, v.holder, v.token, v.value, v.elected_at, v.expires_at
            FROM fencelock.leaders AS v
            ORDER BY v.name
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json),
    'jobs', coalesce((
        SELECT json_agg(t ORDER BY t.started_at DESC, t.job) FROM (
            SELECT j.job, j.slot, j.holder, j.token, j.attempt, j.started_at, j.finished_at, j.outcome, j.error
            FROM fencelock.job_ledger AS j
            ORDER BY j.started_at DESC, j.job
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json),
    'fences', coalesce((
        SELECT json_agg(t ORDER BY t.resource) FROM (
            SELECT f.resource, f.token
            FROM fencelock.fences AS f
            ORDER BY f.resource
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json),
    'rate_limits', coalesce((
        SELECT json_agg(t ORDER BY t.decided_at DESC, t.key) FROM (
            SELECT r.key, r.tat, r.allowed, r.decided_at
            FROM fencelock.rate_limits AS r
            ORDER BY r.decided_at DESC, r.key
            LIMIT sqlc.arg(max_rows)::int + 1) AS t), '[]'::json)
)::text AS snapshot;

