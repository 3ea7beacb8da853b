-- +goose Up
-- Counting semaphores: at most permit_limit holders of a named semaphore at once, each holding
-- a permit that is a lease (semaphore.go). Permit i of semaphore S is the lease row named
-- 'S#i' of fencelock.leases (0 <= i < greatest(permit_limit, slots)): renewed by its lessor's
-- heartbeat, guarded and fenced like any lease, shown by fencelock.holders, released or
-- force-released by name, swept when expired, and granted a fencing token of its own by
-- next_token. A lease name of that form belongs to the semaphore: do not take it as a lease.
--
-- The invariant: a grant happens only while fewer than permit_limit permit rows of the
-- semaphore are unexpired on the database clock, so never more than permit_limit permits are
-- unexpired at once (a limit lowered at run time ends no permit: the count falls to the new
-- limit as permits end, and nothing is granted until it is below it).

-- A permit row records the wait (Acquire or TryAcquire call) it was granted to, so that the
-- cleanup of an attempt whose outcome its client does not know ends only that attempt's grant.
ALTER TABLE fencelock.leases ADD COLUMN permit_wait bigint;

CREATE TABLE fencelock.semaphores (
    name         text        PRIMARY KEY,
    -- At most this many unexpired permits; changed at run time by Semaphore.SetLimit.
    permit_limit integer     NOT NULL CHECK (permit_limit > 0),
    -- Slots ever granted: permit rows may exist for 0 <= i < slots (after a limit lowered).
    slots        integer     NOT NULL DEFAULT 0 CHECK (slots >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Waiters for a permit, first come, first served: one row per waiting Acquire (wait_id), so
-- one lessor may wait for several permits of a semaphore at once. Live while expires_at is
-- ahead on the database clock; a waiter refreshes its row, leaves it when it gives up, and a
-- waiter that dies leaves the queue when its row expires. Swept by fencelock.SweepLeases.
CREATE SEQUENCE fencelock.semaphore_waiters_seq;

CREATE TABLE fencelock.semaphore_waiters (
    semaphore  text        NOT NULL,
    wait_id    bigint      NOT NULL,
    holder     text        NOT NULL,
    -- Arrival order: nextval of fencelock.semaphore_waiters_seq when the wait joined.
    seq        bigint      NOT NULL,
    -- NOTIFY channel of the holder's listening connection; NULL: the waiter polls.
    channel    text,
    since      timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (semaphore, wait_id)
) WITH (fillfactor = 70);

CREATE INDEX semaphore_waiters_queue ON fencelock.semaphore_waiters (semaphore, seq);

-- fencelock.semaphore_slots(sem, n): the lease names of permits 0..n-1 of sem.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_slots(sem text, n integer) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ARRAY(SELECT sem || '#' || i FROM pg_catalog.generate_series(0, n - 1) AS i) $$;
-- +goose StatementEnd

-- fencelock.semaphore_wake(sem, k, at) sends a NOTIFY to each listening waiter among the first
-- k live waiters of sem (time at): the payload of fencelock.hand_off with token 0 ("try now").
-- A hint only: the waiter's own attempt decides. Returns how many were sent.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_wake(sem text, k bigint, at timestamptz) RETURNS integer
LANGUAGE sql VOLATILE
AS $$
    SELECT count(pg_catalog.pg_notify(q.channel, pg_catalog.concat_ws(' ', q.wait_id, 0, 0,
               pg_catalog.octet_length(q.holder), q.holder || sem)))::integer
    FROM (SELECT w.channel, w.wait_id, w.holder FROM fencelock.semaphore_waiters AS w
          WHERE w.semaphore = sem AND w.expires_at > at
          ORDER BY w.seq LIMIT greatest(k, 0)) AS q
    WHERE q.channel IS NOT NULL;
$$;
-- +goose StatementEnd

-- fencelock.semaphore_acquire: one attempt to take a permit of sem for holder, in one call.
--  * The semaphore's row is created with default_limit when it has none, and locked FOR
--    UPDATE: grants of one semaphore are serialised, so two cannot both count the last free
--    permit. Then permit rows are locked, but never waited for (SKIP LOCKED, below), so no
--    cycle can go through a grant (no other statement locks a semaphore row while holding a
--    permit row). Keep it SKIP LOCKED.
--  * t is read once, after that lock. One statement then reads the permit rows (the snapshot,
--    taken after the lock) and locks FOR UPDATE SKIP LOCKED those of them expired at t. A row
--    it cannot lock at once (a renewal in flight on it, whose commit may make it unexpired
--    again; a guarded transaction of its old holder still open; a sweep deleting it) is not
--    waited for: it counts as held and is not granted. A row it locks was expired at t in its
--    latest version (the lock rechecks a row updated since the snapshot), and no renewal can
--    extend it until this commits: a renewal skips a locked row, and rechecks the expiry in
--    its UPDATE (LeaseRenew), so after this commits it finds the row expired or granted to
--    someone else. held = rows read - rows locked: every row unexpired at t, and every row
--    that is not free for certain, so the count only errs high. The cost is one index probe
--    per slot (greatest(limit, slots)), plus one per expired row. Waits: for the semaphore's
--    row; for the picked slot only while someone else inserts a row of its name (a placeholder
--    of force_release, or a plain lease of the name, which is misuse); for a waiter row a
--    sweep is deleting.
--  * Waiters are served first come, first served: a wait is granted only while the permits
--    free cover it and every live waiter ahead of it (ahead < limit - held). A try (queue =
--    false) counts every live waiter as ahead: it never takes a permit someone waits for.
--  * Granted (outcome 1): the lowest free slot below the limit (one exists: held < limit),
--    a token from next_token under the permit row's lock (larger than every earlier token;
--    durable when this commits: next_token raises synchronous_commit to on), acquired at t
--    and expiring at t + ttl (after the client sent the call, as its trust window needs), the
--    wait's row out of the queue, and a wake-up for the next waiter if permits are still free.
--  * Refused (outcome 4): with queue, the wait joins the queue at the back, or refreshes its
--    row (keeping its place while the row is live); committed with synchronous_commit off
--    (a queue row lost in a crash costs one refresh). remaining_us is the time until the
--    first held permit expires (0 when none is held: the refusal was for the waiters ahead).
-- server_now is clock_timestamp() at the end (after the client sent the call).
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_acquire(sem text, who text, wait bigint, ttl_us bigint,
    default_limit integer, queue boolean, chan text, live_us bigint)
RETURNS TABLE (outcome integer, name text, token bigint, expires_at timestamptz,
    server_now timestamptz, ahead bigint, remaining_us bigint, permit_limit integer)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    lim integer;
    hw integer;
    t timestamptz;
    held integer;
    n_ahead bigint;
    pick integer;
    tok bigint;
    exp timestamptz;
    soonest timestamptz;
BEGIN
    SELECT s.permit_limit, s.slots INTO lim, hw FROM fencelock.semaphores AS s WHERE s.name = sem FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO fencelock.semaphores AS s (name, permit_limit) VALUES (sem, default_limit)
        ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
        SELECT s.permit_limit, s.slots INTO lim, hw FROM fencelock.semaphores AS s WHERE s.name = sem FOR UPDATE;
    END IF;
    t := pg_catalog.clock_timestamp();
    WITH rd AS MATERIALIZED (
        SELECT l.name, l.expires_at FROM fencelock.leases AS l
        WHERE l.name = ANY (fencelock.semaphore_slots(sem, greatest(lim, hw)))
    ), lk AS MATERIALIZED (
        SELECT l.name FROM fencelock.leases AS l
        WHERE l.name = ANY (ARRAY(SELECT rd.name FROM rd WHERE rd.expires_at <= t)) AND l.expires_at <= t
        FOR UPDATE OF l SKIP LOCKED
    )
    SELECT (SELECT count(*) FROM rd) - (SELECT count(*) FROM lk),
           (SELECT min(rd.expires_at) FROM rd WHERE rd.expires_at > t),
           (SELECT min(g.i) FROM pg_catalog.generate_series(0, lim - 1) AS g(i)
            WHERE sem || '#' || g.i NOT IN (SELECT rd.name FROM rd WHERE rd.name NOT IN (SELECT lk.name FROM lk)))
    INTO held, soonest, pick;
    SELECT count(*) INTO n_ahead FROM fencelock.semaphore_waiters AS w
    WHERE w.semaphore = sem AND w.wait_id <> wait AND w.expires_at > t
      AND w.seq < coalesce((SELECT m.seq FROM fencelock.semaphore_waiters AS m
                            WHERE queue AND m.semaphore = sem AND m.wait_id = wait AND m.expires_at > t),
                           9223372036854775807);
    IF n_ahead < lim - held THEN
        tok := fencelock.next_token(false);
        INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at, permit_wait)
        VALUES (sem || '#' || pick, who, tok, t, t + ttl_us * interval '1 microsecond', wait)
        ON CONFLICT ON CONSTRAINT leases_pkey DO UPDATE
            SET holder = excluded.holder, token = excluded.token,
                acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,
                permit_wait = excluded.permit_wait
            WHERE l.expires_at <= t
        RETURNING l.expires_at INTO exp;
        IF exp IS NULL THEN
            RAISE EXCEPTION 'fencelock: permit % of semaphore % is not free', pick, sem;
        END IF;
        IF pick >= hw THEN
            UPDATE fencelock.semaphores AS s SET slots = pick + 1 WHERE s.name = sem;
        END IF;
        IF queue THEN
            DELETE FROM fencelock.semaphore_waiters AS w WHERE w.semaphore = sem AND w.wait_id = wait;
        END IF;
        IF lim - held > 1 THEN
            PERFORM fencelock.semaphore_wake(sem, 1, t);
        END IF;
        RETURN QUERY SELECT 1, sem || '#' || pick, tok, exp, pg_catalog.clock_timestamp(), n_ahead, 0::bigint, lim;
        RETURN;
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    IF queue THEN
        INSERT INTO fencelock.semaphore_waiters AS w (semaphore, wait_id, holder, seq, channel, since, expires_at)
        VALUES (sem, wait, who, nextval('fencelock.semaphore_waiters_seq'), nullif(chan, ''), t,
                t + live_us * interval '1 microsecond')
        ON CONFLICT ON CONSTRAINT semaphore_waiters_pkey DO UPDATE
            SET seq = CASE WHEN w.expires_at > t THEN w.seq ELSE excluded.seq END,
                since = CASE WHEN w.expires_at > t THEN w.since ELSE excluded.since END,
                channel = excluded.channel, expires_at = excluded.expires_at;
    END IF;
    RETURN QUERY SELECT 4, NULL::text, 0::bigint, NULL::timestamptz, pg_catalog.clock_timestamp(), n_ahead,
        CASE WHEN soonest IS NULL THEN 0
             ELSE greatest(0, (EXTRACT(epoch FROM soonest - pg_catalog.clock_timestamp()) * 1000000)::bigint) END,
        lim;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_release(sem, slot, who, tok) ends the permit (slot, who, tok), scoped
-- to that grant (0: it had expired or been taken over; nothing changed), and wakes the first
-- two live waiters (2 when it woke someone, else 1): the head, for whom it freed a permit,
-- and the next, in case the head is leaving or is being granted by a statement that counted
-- this permit as held. A grant wakes the next waiter if permits are still free. It waits for
-- no lock but its permit row's, and reads no other permit: O(1). Committed with
-- synchronous_commit off: a release lost in a crash leaves the permit held until its TTL
-- ends, never longer.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_release(sem text, slot text, who text, tok bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
BEGIN
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    UPDATE fencelock.leases AS l SET expires_at = t
    WHERE l.name = slot AND l.holder = who AND l.token = tok AND l.expires_at > t;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- Wake the first two: the head may be leaving (its wake-up then goes nowhere) or being
    -- granted by a statement in flight that counted this permit as held (and takes the head
    -- out of the queue); the second then finds the permit free. A wake-up is a hint (the
    -- waiter's attempt decides), so one too many costs a refused attempt. No lock is taken:
    -- a release never queues behind grants.
    IF fencelock.semaphore_wake(sem, 2, pg_catalog.clock_timestamp()) > 0 THEN
        RETURN 2;
    END IF;
    RETURN 1;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_leave(sem, wait) takes the wait out of the semaphore's queue (a waiter
-- that gave up) and, when it was there, wakes the first live waiter: the one that left may have
-- been woken for a permit it will now not take.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_leave(sem text, wait bigint) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    DELETE FROM fencelock.semaphore_waiters AS w WHERE w.semaphore = sem AND w.wait_id = wait;
    IF FOUND THEN
        PERFORM fencelock.semaphore_wake(sem, 1, pg_catalog.clock_timestamp());
    END IF;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_set_limit(sem, n) sets the limit of sem (creating its row), and wakes
-- the waiters a larger limit lets in. Returns the previous limit (0 when the row is new).
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_set_limit(sem text, n integer) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    prev integer;
BEGIN
    SELECT s.permit_limit INTO prev FROM fencelock.semaphores AS s WHERE s.name = sem FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO fencelock.semaphores AS s (name, permit_limit) VALUES (sem, n)
        ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
        IF FOUND THEN
            prev := 0;
        ELSE -- created meanwhile (by a first acquire)
            SELECT s.permit_limit INTO prev FROM fencelock.semaphores AS s WHERE s.name = sem FOR UPDATE;
        END IF;
    END IF;
    UPDATE fencelock.semaphores AS s SET permit_limit = n, updated_at = now() WHERE s.name = sem;
    IF n > prev THEN
        PERFORM fencelock.semaphore_wake(sem, n - prev, pg_catalog.clock_timestamp());
    END IF;
    RETURN prev;
END
$$;
-- +goose StatementEnd

-- Per semaphore: its limit, the permits unexpired now, and the live waiters.
CREATE VIEW fencelock.semaphore_state AS
SELECT s.name, s.permit_limit,
       (SELECT count(*) FROM fencelock.leases AS l
        WHERE l.name = ANY (fencelock.semaphore_slots(s.name, greatest(s.permit_limit, s.slots)))
          AND l.expires_at > pg_catalog.clock_timestamp()) AS held,
       (SELECT count(*) FROM fencelock.semaphore_waiters AS w
        WHERE w.semaphore = s.name AND w.expires_at > pg_catalog.clock_timestamp()) AS waiting
FROM fencelock.semaphores AS s;

-- Roles that take leases may take permits (fencelock.grant_to_lease_roles: migration 00006).
SELECT fencelock.grant_to_lease_roles('SELECT, INSERT, UPDATE, DELETE', 'fencelock.semaphores, fencelock.semaphore_waiters');
SELECT fencelock.grant_to_lease_roles('USAGE', 'SEQUENCE fencelock.semaphore_waiters_seq');
SELECT fencelock.grant_to_lease_roles('SELECT', 'fencelock.semaphore_state');

-- +goose Down
DROP VIEW fencelock.semaphore_state;
DROP FUNCTION fencelock.semaphore_set_limit(text, integer);
DROP FUNCTION fencelock.semaphore_leave(text, bigint);
DROP FUNCTION fencelock.semaphore_release(text, text, text, bigint);
DROP FUNCTION fencelock.semaphore_acquire(text, text, bigint, bigint, integer, boolean, text, bigint);
DROP FUNCTION fencelock.semaphore_wake(text, bigint, timestamptz);
DROP FUNCTION fencelock.semaphore_slots(text, integer);
DROP TABLE fencelock.semaphore_waiters;
DROP SEQUENCE fencelock.semaphore_waiters_seq;
DROP TABLE fencelock.semaphores;
ALTER TABLE fencelock.leases DROP COLUMN permit_wait;
