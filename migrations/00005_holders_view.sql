-- +goose Up
-- Operating fencelock: who holds what, in SQL (issue 11).
--
-- The renewal count of the current grant. A renewal sets renewals to 1 when renewed_token is
-- not the row's token (the first renewal of this grant) and adds 1 otherwise, so no grant path
-- (LeaseGrant, fencelock.hand_off) needs to reset anything: a count left by an earlier grant
-- is ignored because its renewed_token is not the current token. Adding columns with constant
-- defaults rewrites nothing (PostgreSQL 11+), and renewals stay HOT updates (no index).
ALTER TABLE fencelock.leases
    ADD COLUMN renewals      bigint      NOT NULL DEFAULT 0,
    ADD COLUMN renewed_token bigint      NOT NULL DEFAULT 0,
    ADD COLUMN renewed_at    timestamptz;

-- Every lease held right now (TTL grants; transaction-scoped RunLocked grants expire at their
-- transaction's start and are not listed), with what an operator asks: who, which token, how
-- long it has been held and has left, how often and when it was last renewed, and who waits.
--   ttl              the TTL of the last grant or renewal (expires_at minus when it was set)
--   heartbeat        'ok' while the last renewal (or the grant) is younger than half the TTL;
--                    'late' past that (the holder's heartbeat, every third of the TTL by
--                    default, missed a round: a paused or partitioned holder)
--   waiters          live waiters in the name's queue (fencelock.lease_queue)
CREATE VIEW fencelock.holders AS
SELECT l.name, l.holder, l.token,
       l.acquired_at,
       clock_timestamp() - l.acquired_at AS held_for,
       l.expires_at,
       l.expires_at - clock_timestamp() AS ttl_left,
       l.expires_at - coalesce(CASE WHEN l.renewed_token = l.token THEN l.renewed_at END, l.acquired_at) AS ttl,
       CASE WHEN l.renewed_token = l.token THEN l.renewals ELSE 0 END AS renewals,
       CASE WHEN l.renewed_token = l.token THEN l.renewed_at END AS last_renewal,
       CASE WHEN clock_timestamp() - coalesce(CASE WHEN l.renewed_token = l.token THEN l.renewed_at END, l.acquired_at)
                 < (l.expires_at - coalesce(CASE WHEN l.renewed_token = l.token THEN l.renewed_at END, l.acquired_at)) / 2
            THEN 'ok' ELSE 'late' END AS heartbeat,
       coalesce(q.waiters, 0) AS waiters,
       q.head_holder AS next_holder
FROM fencelock.leases AS l
LEFT JOIN fencelock.lease_queue_summary AS q ON q.name = l.name
WHERE l.token > 0 AND l.expires_at > clock_timestamp();

-- Advisory locks held or awaited in this database, from pg_locks joined with pg_stat_activity.
-- key is the int64 advisory lock key (one-key form), key1/key2 the pair form (two int4 keys);
-- name is the lock's name for session locks taken by fencelock (which sets application_name to
-- "fencelock <name>" on the lock's own session), else NULL. Sessions of other roles show NULL
-- client_addr, backend_start, xact_start and state_change unless the reader has
-- pg_read_all_stats (pg_monitor); pg_locks itself is readable by every role.
CREATE VIEW fencelock.advisory_locks AS
SELECT CASE WHEN k.objsubid = 1 THEN (k.classid::bigint << 32) | k.objid::bigint END AS key,
       CASE WHEN k.objsubid = 2 THEN k.classid::bigint::integer END AS key1,
       CASE WHEN k.objsubid = 2 THEN k.objid::bigint::integer END AS key2,
       CASE WHEN a.application_name LIKE 'fencelock %' AND a.application_name NOT LIKE 'fencelock key %'
            THEN substr(a.application_name, 11) END AS name,
       CASE k.mode WHEN 'ExclusiveLock' THEN 'exclusive' ELSE 'shared' END AS mode,
       k.granted,
       k.pid,
       a.application_name,
       a.client_addr,
       a.backend_start,
       a.xact_start,
       a.state,
       a.state_change,
       k.waitstart,
       pg_catalog.pg_blocking_pids(k.pid) AS blocked_by
FROM pg_catalog.pg_locks AS k
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = k.pid
WHERE k.locktype = 'advisory'
  AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database());

-- fencelock.force_release(name, fence) ends the current grant of the lease name, whoever holds
-- it, and fences its holder out: the lease goes to the head of the name's queue with a fresh
-- token (as a release would hand it over), or, with nobody waiting, stays free with a fresh token
-- recorded on its row; and the high-water mark of each resource in fence is raised to that
-- token, so a paused holder that wakes up has its fenced writes rejected even where its token
-- travels without the lease (FenceTx, UpdateFencedTx with a token column kept elsewhere is the
-- caller's to raise). It returns the holder and token it ended (NULL when nothing was held) and
-- the token that now fences them out. It waits for a guarded transaction of the holder (FOR
-- KEY SHARE on the row) to end; callers bound it with lock_timeout.
-- +goose StatementBegin
CREATE FUNCTION fencelock.force_release(lease_name text, fence text[])
RETURNS TABLE (old_holder text, old_token bigint, new_token bigint, handed_to text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    cur record;
    outcome integer;
BEGIN
    SELECT l.holder, l.token INTO cur
    FROM fencelock.leases AS l
    WHERE l.name = lease_name AND l.token > 0 AND l.expires_at > pg_catalog.clock_timestamp()
    FOR UPDATE;
    IF FOUND THEN
        old_holder := cur.holder;
        old_token := cur.token;
        outcome := fencelock.hand_off(lease_name, cur.holder, cur.token);
    END IF;
    IF outcome IN (2, 3) THEN
        SELECT l.token, l.holder INTO new_token, handed_to FROM fencelock.leases AS l WHERE l.name = lease_name;
    ELSE
        -- Free (or never held): a fresh token on the row, so the next grant's token, and the
        -- fences raised here, are both larger than any token of the old holder.
        new_token := fencelock.next_token(false);
        UPDATE fencelock.leases AS l
        SET token = new_token, holder = 'fencelock force-release', expires_at = pg_catalog.clock_timestamp()
        WHERE l.name = lease_name AND l.expires_at <= pg_catalog.clock_timestamp();
    END IF;
    INSERT INTO fencelock.fences AS f (resource, token)
    SELECT DISTINCT r, new_token FROM unnest(fence) AS r
    ON CONFLICT (resource) DO UPDATE SET token = greatest(f.token, excluded.token);
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- Roles that take leases (those that may insert into fencelock.leases) may read the views.
-- +goose StatementBegin
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
        WHERE c.oid = 'fencelock.leases'::regclass
          AND a.privilege_type = 'INSERT' AND a.grantee <> 0
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT ON fencelock.holders, fencelock.advisory_locks TO %s', r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
               WHERE c.oid = 'fencelock.leases'::regclass
                 AND a.privilege_type = 'INSERT' AND a.grantee = 0) THEN
        GRANT SELECT ON fencelock.holders, fencelock.advisory_locks TO PUBLIC;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencelock.force_release(text, text[]);
DROP VIEW fencelock.advisory_locks;
DROP VIEW fencelock.holders;
ALTER TABLE fencelock.leases DROP COLUMN renewed_at, DROP COLUMN renewed_token, DROP COLUMN renewals;
