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
    -- The TTL of the grant it waits for, in microseconds.
    ttl_us             bigint      NOT NULL CHECK (ttl_us > 0),
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
DROP VIEW fencelock.lease_queue_summary;
DROP VIEW fencelock.lease_queue;
DROP TABLE fencelock.lease_waiters;
DROP SEQUENCE fencelock.lease_waiters_seq;
