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
--                    'late' past that: with the default heartbeat (every third of the TTL) the
--                    holder missed a round (paused, partitioned, or its renewals fail). A
--                    lease renewed less often than every half TTL (WithHeartbeatInterval above
--                    it, WithoutHeartbeat) reads 'late' in each interval's second half by design.
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
-- key is the int64 advisory lock key (one-key form); key1 and key2 the pair form (two int4 keys:
-- pg_locks keeps them as oids, whose cast to integer gives back the signed key). name is read
-- from the holding session's application_name, which fencelock's session locks set to
-- "fencelock <name>" and PostgreSQL cuts to 63 bytes: the lock's name when it has at most 53
-- bytes, its first 53 bytes otherwise; NULL for locks taken by key, and for sessions that
-- fencelock did not name. A session that holds several advisory locks shows its one name on
-- each. blocked_by (pg_blocking_pids, which takes every lock-manager partition lock) is read
-- only for locks still awaited. Sessions of other roles show NULL client_addr, backend_start,
-- xact_start and state_change unless the reader has pg_read_all_stats (pg_monitor); pg_locks
-- itself is readable by every role.
CREATE VIEW fencelock.advisory_locks AS
SELECT CASE WHEN k.objsubid = 1 THEN (k.classid::bigint << 32) | k.objid::bigint END AS key,
       CASE WHEN k.objsubid = 2 THEN k.classid::integer END AS key1,
       CASE WHEN k.objsubid = 2 THEN k.objid::integer END AS key2,
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
       CASE WHEN NOT k.granted THEN pg_catalog.pg_blocking_pids(k.pid) END AS blocked_by
FROM pg_catalog.pg_locks AS k
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = k.pid
WHERE k.locktype = 'advisory'
  AND k.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database());

-- fencelock.hand_off (migration 00004) dates a handed-over grant from now(), the start of the
-- caller's transaction. A release is one short statement, but force_release may wait for the
-- row (a guarded transaction of the holder, a RunLocked) for as long as its caller's
-- lock_timeout: a grant dated from before that wait could expire before it commits. The same
-- function, dated from clock_timestamp(), the moment of the hand-off.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.hand_off(lease_name text, from_holder text, from_token bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    h record;
    tok bigint;
    exp timestamptz;
    woke boolean;
BEGIN
    -- The grant, locked FOR UPDATE as a grant needs it; skipped when someone else holds a lock
    -- on the row: a guarded transaction of the holder (FOR KEY SHARE), or the holder's
    -- renewal in flight.
    PERFORM 1 FROM fencelock.leases AS l
    WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        -- The head, locked. Its row may be deleted (the head gave up) while this waits for
        -- its lock: look again, a few times, while anyone live waits.
        FOR i IN 1..3 LOOP
            SELECT w.holder, w.wait_id, w.channel, w.ttl_us INTO h
            FROM fencelock.lease_waiters AS w
            WHERE w.name = lease_name AND w.holder <> from_holder AND w.granted_token = 0
              AND w.expires_at > pg_catalog.clock_timestamp()
            ORDER BY w.seq
            LIMIT 1
            FOR UPDATE;
            EXIT WHEN FOUND OR NOT EXISTS (
                SELECT 1 FROM fencelock.lease_waiters AS q
                WHERE q.name = lease_name AND q.holder <> from_holder AND q.granted_token = 0
                  AND q.expires_at > pg_catalog.clock_timestamp());
        END LOOP;
        -- A head that waits for a TTL grant takes it here; one that waits to run a
        -- transaction-scoped grant (ttl_us 0) is woken below to take the free lease itself.
        IF h.holder IS NOT NULL AND h.ttl_us > 0 THEN
            tok := fencelock.next_token(false);
            UPDATE fencelock.lease_waiters AS w
            SET granted_token = tok, granted_expires_at = pg_catalog.clock_timestamp() + h.ttl_us * interval '1 microsecond',
                expires_at = pg_catalog.clock_timestamp()
            WHERE w.name = lease_name AND w.holder = h.holder
            RETURNING w.granted_expires_at INTO exp;
            UPDATE fencelock.leases AS l
            SET holder = h.holder, token = tok, acquired_at = pg_catalog.clock_timestamp(), expires_at = exp
            WHERE l.name = lease_name
            RETURNING CASE WHEN h.channel IS NULL THEN false ELSE
                pg_catalog.pg_notify(h.channel, pg_catalog.concat_ws(' ', h.wait_id, tok,
                    (EXTRACT(epoch FROM exp) * 1000000)::bigint,
                    pg_catalog.octet_length(h.holder), h.holder || lease_name)) IS NOT NULL END INTO woke;
            RETURN CASE WHEN woke THEN 3 ELSE 2 END;
        END IF;
    ELSE
        -- Locked by someone else: release without a hand-off (below) once the renewal in
        -- flight, if any, has committed (FOR NO KEY UPDATE does not wait for FOR KEY SHARE).
        PERFORM 1 FROM fencelock.leases AS l
        WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token
          AND l.expires_at > pg_catalog.clock_timestamp()
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN 0;
        END IF;
    END IF;
    UPDATE fencelock.leases AS l
    SET expires_at = pg_catalog.clock_timestamp()
    WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token;
    -- Wake the head, without a grant, to try for itself.
    PERFORM pg_catalog.pg_notify(q.channel, pg_catalog.concat_ws(' ', q.wait_id, 0, 0,
                pg_catalog.octet_length(q.holder), q.holder || lease_name))
    FROM (SELECT w.holder, w.wait_id, w.channel FROM fencelock.lease_waiters AS w
          WHERE w.name = lease_name AND w.holder <> from_holder AND w.granted_token = 0
            AND w.expires_at > pg_catalog.clock_timestamp()
          ORDER BY w.seq LIMIT 1) AS q
    WHERE q.channel IS NOT NULL;
    RETURN 1;
END
$$;
-- +goose StatementEnd

-- fencelock.force_release(name, fence, expected_token) ends the current grant of the lease name,
-- whoever holds it, and fences its holder out. It locks the lease row first (creating an
-- expired placeholder row, token 0, when the name has none), so it waits for whatever holds
-- the row: a guarded transaction of the holder (GuardTx, FenceTx: FOR KEY SHARE), a RunLocked
-- (FOR UPDATE), a grant in flight; callers bound the wait with lock_timeout. Only under that
-- lock does it decide whether the lease is held:
--   * held (a TTL grant, unexpired): the grant ends as a release would end it
--     (fencelock.hand_off): the lease goes to the head of the queue with a fresh token, or,
--     when nobody waits or the head waits for a RunLocked (which is woken to take it), stays
--     free;
--   * not held: a fresh token is drawn and recorded on the row (holder 'fencelock
--     force-release', expired), so the next grant's token is larger still.
-- Either way, the high-water mark of each resource in fence is raised to the new token, so a
-- paused holder that wakes up has its fenced writes rejected even where its token travels
-- without the lease (FenceTx; a token column kept by UpdateFencedTx is the caller's to raise).
-- The holder's transactions lock the lease row before any fence row (GuardTx, then the
-- write's FenceTx), as this function does; one that takes a fence row first and the lease row
-- after may deadlock with it, and PostgreSQL then aborts one of the two (SQLSTATE 40P01).
--
-- It returns the holder and token of the last grant (old_holder, old_token; NULL when the name
-- never had one), whether that grant had lapsed already (lapsed: expired on the database clock,
-- not taken over), the token that now fences its holder out (new_token; NULL when nothing
-- changed) and who the lease was handed to (handed_to; NULL when nobody). With expected_token
-- not NULL it changes nothing unless the last grant has exactly that token, lapsed or not: an
-- operator who read token T ends T, or fences T out once it has lapsed, and never touches a
-- newer grant that replaced it meanwhile.
-- +goose StatementBegin
CREATE FUNCTION fencelock.force_release(lease_name text, fence text[], expected_token bigint DEFAULT NULL)
RETURNS TABLE (old_holder text, old_token bigint, lapsed boolean, new_token bigint, handed_to text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    cur record;
    outcome integer;
BEGIN
    LOOP
        INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
        VALUES (lease_name, 'fencelock force-release', 0, now(), now())
        ON CONFLICT (name) DO NOTHING;
        SELECT l.holder, l.token, l.token > 0 AND l.expires_at > pg_catalog.clock_timestamp() AS held INTO cur
        FROM fencelock.leases AS l
        WHERE l.name = lease_name
        FOR UPDATE;
        EXIT WHEN FOUND; -- else a sweep deleted the row while this waited for it: again
    END LOOP;
    IF cur.token > 0 AND cur.holder <> 'fencelock force-release' THEN
        old_holder := cur.holder;
        old_token := cur.token;
        lapsed := NOT cur.held;
    END IF;
    IF expected_token IS NOT NULL AND old_token IS DISTINCT FROM expected_token THEN
        RETURN NEXT; -- not the grant the caller meant: nothing changed
        RETURN;
    END IF;
    IF cur.held THEN
        outcome := fencelock.hand_off(lease_name, cur.holder, cur.token);
    END IF;
    IF outcome IN (2, 3) THEN
        SELECT l.token, l.holder INTO new_token, handed_to FROM fencelock.leases AS l WHERE l.name = lease_name;
    ELSE
        new_token := fencelock.next_token(false);
        UPDATE fencelock.leases AS l
        SET token = new_token, holder = 'fencelock force-release', expires_at = pg_catalog.clock_timestamp()
        WHERE l.name = lease_name;
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
DROP FUNCTION fencelock.force_release(text, text[], bigint);
-- hand_off as migration 00004 made it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.hand_off(lease_name text, from_holder text, from_token bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    h record;
    tok bigint;
    exp timestamptz;
    woke boolean;
BEGIN
    -- The grant, locked FOR UPDATE as a grant needs it; skipped when someone else holds a lock
    -- on the row: a guarded transaction of the holder (FOR KEY SHARE), or the holder's
    -- renewal in flight.
    PERFORM 1 FROM fencelock.leases AS l
    WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        -- The head, locked. Its row may be deleted (the head gave up) while this waits for
        -- its lock: look again, a few times, while anyone live waits.
        FOR i IN 1..3 LOOP
            SELECT w.holder, w.wait_id, w.channel, w.ttl_us INTO h
            FROM fencelock.lease_waiters AS w
            WHERE w.name = lease_name AND w.holder <> from_holder AND w.granted_token = 0
              AND w.expires_at > pg_catalog.clock_timestamp()
            ORDER BY w.seq
            LIMIT 1
            FOR UPDATE;
            EXIT WHEN FOUND OR NOT EXISTS (
                SELECT 1 FROM fencelock.lease_waiters AS q
                WHERE q.name = lease_name AND q.holder <> from_holder AND q.granted_token = 0
                  AND q.expires_at > pg_catalog.clock_timestamp());
        END LOOP;
        -- A head that waits for a TTL grant takes it here; one that waits to run a
        -- transaction-scoped grant (ttl_us 0) is woken below to take the free lease itself.
        IF h.holder IS NOT NULL AND h.ttl_us > 0 THEN
            tok := fencelock.next_token(false);
            UPDATE fencelock.lease_waiters AS w
            SET granted_token = tok, granted_expires_at = now() + h.ttl_us * interval '1 microsecond',
                expires_at = pg_catalog.clock_timestamp()
            WHERE w.name = lease_name AND w.holder = h.holder
            RETURNING w.granted_expires_at INTO exp;
            UPDATE fencelock.leases AS l
            SET holder = h.holder, token = tok, acquired_at = now(), expires_at = exp
            WHERE l.name = lease_name
            RETURNING CASE WHEN h.channel IS NULL THEN false ELSE
                pg_catalog.pg_notify(h.channel, pg_catalog.concat_ws(' ', h.wait_id, tok,
                    (EXTRACT(epoch FROM exp) * 1000000)::bigint,
                    pg_catalog.octet_length(h.holder), h.holder || lease_name)) IS NOT NULL END INTO woke;
            RETURN CASE WHEN woke THEN 3 ELSE 2 END;
        END IF;
    ELSE
        -- Locked by someone else: release without a hand-off (below) once the renewal in
        -- flight, if any, has committed (FOR NO KEY UPDATE does not wait for FOR KEY SHARE).
        PERFORM 1 FROM fencelock.leases AS l
        WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token
          AND l.expires_at > pg_catalog.clock_timestamp()
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN 0;
        END IF;
    END IF;
    UPDATE fencelock.leases AS l
    SET expires_at = pg_catalog.clock_timestamp()
    WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token;
    -- Wake the head, without a grant, to try for itself.
    PERFORM pg_catalog.pg_notify(q.channel, pg_catalog.concat_ws(' ', q.wait_id, 0, 0,
                pg_catalog.octet_length(q.holder), q.holder || lease_name))
    FROM (SELECT w.holder, w.wait_id, w.channel FROM fencelock.lease_waiters AS w
          WHERE w.name = lease_name AND w.holder <> from_holder AND w.granted_token = 0
            AND w.expires_at > pg_catalog.clock_timestamp()
          ORDER BY w.seq LIMIT 1) AS q
    WHERE q.channel IS NOT NULL;
    RETURN 1;
END
$$;
-- +goose StatementEnd
DROP VIEW fencelock.advisory_locks;
DROP VIEW fencelock.holders;
ALTER TABLE fencelock.leases DROP COLUMN renewed_at, DROP COLUMN renewed_token, DROP COLUMN renewals;
