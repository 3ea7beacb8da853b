-- +goose Up
-- The queue of lease waiters: one row per (name, holder) that waits for the name, served first
-- come, first served. A waiting Lessor.Acquire joins with its first refused attempt and stays
-- while it refreshes its row; a release hands the lease straight to the head of the queue, in
-- the release's own statement, and wakes only that waiter (NOTIFY on the channel of its
-- lessor's listening connection). A release nobody waits for sends no NOTIFY.
--
-- A row is a live waiter while granted_token = 0 and expires_at is ahead on the database
-- clock: a waiter that dies or is paused leaves the queue when its row expires (the waiter's
-- liveness, a few seconds; see lease_queue.go), a waiter that gives up deletes its row. A
-- release that hands the lease over records the grant in the head's row (granted_token,
-- granted_expires_at) and ends its liveness, so a refresh of that waiter in flight finds its
-- grant there instead of joining again. Rows are swept by fencelock.SweepLeases once expired
-- for its grace period.
CREATE SEQUENCE fencelock.lease_waiters_seq;

CREATE TABLE fencelock.lease_waiters (
    name               text        NOT NULL,
    holder             text        NOT NULL,
    -- The client's wait: a refresh of the same wait keeps its place, a new wait joins at the back.
    wait_id            bigint      NOT NULL,
    -- Arrival order: nextval of fencelock.lease_waiters_seq when the wait joined.
    seq                bigint      NOT NULL,
    -- NOTIFY channel of the holder's listening connection; NULL: the waiter polls.
    channel            text,
    -- The TTL of the grant it waits for, in microseconds; 0 for a transaction-scoped grant
    -- (RunLocked), which a release does not hand over but wakes to take for itself.
    ttl_us             bigint      NOT NULL CHECK (ttl_us >= 0),
    -- When this wait joined the queue (database clock).
    since              timestamptz NOT NULL,
    -- Liveness: a waiter not refreshed by then has left the queue.
    expires_at         timestamptz NOT NULL,
    -- The token a release handed to this wait, 0 while it waits.
    granted_token      bigint      NOT NULL DEFAULT 0,
    granted_expires_at timestamptz,
    PRIMARY KEY (name, holder)
) WITH (fillfactor = 70);

CREATE INDEX lease_waiters_queue ON fencelock.lease_waiters (name, seq);

-- The queue, readable by SQL: every live waiter with its place (1 = head) and how long it has
-- waited.
CREATE VIEW fencelock.lease_queue AS
SELECT w.name, w.holder,
       row_number() OVER (PARTITION BY w.name ORDER BY w.seq) AS position,
       w.since, clock_timestamp() - w.since AS waited,
       w.channel IS NOT NULL AS woken_by_notify
FROM fencelock.lease_waiters AS w
WHERE w.granted_token = 0 AND w.expires_at > clock_timestamp();

-- Per name: how many wait, who is at the head and for how long it has waited.
CREATE VIEW fencelock.lease_queue_summary AS
SELECT q.name, count(*) AS waiters,
       (array_agg(q.holder ORDER BY q.position))[1] AS head_holder,
       max(q.waited) AS head_waited
FROM fencelock.lease_queue AS q
GROUP BY q.name;

-- fencelock.hand_off(name, holder, token) ends the grant (name, holder, token) and hands the
-- lease to the head of the name's queue; LeaseRelease calls it only when its own snapshot saw
-- someone waiting (a release nobody waits for stays the one UPDATE it always was). It returns
-- 0 when the grant is no longer current (nothing changed), 1 when it released the lease without
-- a hand-off (nobody live waits; the head waits for a transaction-scoped grant; or the
-- holder's own guarded transaction holds the row: the head is then woken to grant itself), 2 when it handed the lease over, 3 when it also woke the
-- head (NOTIFY on the channel of the head's listening connection; only the head is woken).
--
-- Each statement here takes a fresh snapshot (READ COMMITTED), so it sees waiters that joined
-- after the caller's statement began. Locks: the lease row first, then the head waiter's row
-- (the order of LeaseAcquire too, so the two never deadlock). The hand-off is a grant and
-- needs what LeaseGrant needs, the row FOR UPDATE, which conflicts with FOR KEY SHARE: taken
-- with SKIP LOCKED, so that with a guarded transaction of the holder still open (a Release
-- from inside it, say) it releases without a hand-off instead of waiting on the holder's own
-- transaction (FOR NO KEY UPDATE, as a renewal, which does not wait for FOR KEY SHARE). The token is drawn by next_token under the row lock, so it
-- is larger than every earlier token of the name, and durable when the caller commits
-- (next_token raises synchronous_commit to on; the lease row is written). The head's row keeps
-- the grant (granted_token, granted_expires_at) and stops being live, so a refresh of that
-- waiter in flight finds its grant instead of joining again.
--
-- The payload is "<wait_id> <token> <expires_at, µs since the Unix epoch> <octets of holder>
-- <holder><name>" (token 0: no grant, try now); the listener routes it by holder id.
-- +goose StatementBegin
CREATE FUNCTION fencelock.hand_off(lease_name text, from_holder text, from_token bigint) RETURNS integer
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

-- Roles that take leases (those that may insert into fencelock.leases) wait in the queue too.
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
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON fencelock.lease_waiters TO %s', r);
        EXECUTE format('GRANT USAGE ON SEQUENCE fencelock.lease_waiters_seq TO %s', r);
        EXECUTE format('GRANT SELECT ON fencelock.lease_queue, fencelock.lease_queue_summary TO %s', r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
               WHERE c.oid = 'fencelock.leases'::regclass
                 AND a.privilege_type = 'INSERT' AND a.grantee = 0) THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON fencelock.lease_waiters TO PUBLIC;
        GRANT USAGE ON SEQUENCE fencelock.lease_waiters_seq TO PUBLIC;
        GRANT SELECT ON fencelock.lease_queue, fencelock.lease_queue_summary TO PUBLIC;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencelock.hand_off(text, text, bigint);
DROP VIEW fencelock.lease_queue_summary;
DROP VIEW fencelock.lease_queue;
DROP TABLE fencelock.lease_waiters;
DROP SEQUENCE fencelock.lease_waiters_seq;
