-- +goose Up
-- Semaphores that hold up under contention (issue 21): a release hands its permit to the head
-- waiter in its own statement, free permits are kept in a set, and no statement of a waiter
-- waits behind another's.
--
-- Before this migration every grant attempt, a waiter's included, locked the semaphore's row
-- FOR UPDATE and read every permit row: grants cost O(limit), and with about 100 waiters the
-- semaphore row had 46 backends queued on it while permits sat free for seconds. Now:
--
--  * Free permits: fencelock.semaphore_free holds (semaphore, slot) for each permit known to
--    be free (released, reclaimed, or never granted). A grant takes one (FOR UPDATE SKIP
--    LOCKED: two grants never wait for each other) and grants that slot's lease row: O(1).
--  * Hand-off: a release gives its permit straight to the head of the queue (a new grant of
--    the same slot, with a fresh token, to the head's wait: leases.permit_wait) and NOTIFYs
--    the head with the grant, as fencelock.hand_off does for a lease. Only when nobody waits
--    does the slot go to the free set. A waiter runs no statement between its refreshes (a
--    third of its liveness), and a refresh of a waiter that is not at the head locks nothing
--    but its own queue row.
--  * Reclaim: a permit whose holder died ends by its TTL without a release. A grant attempt
--    that finds no free permit once fencelock.semaphores.next_reclaim has passed (one attempt
--    at a time: the row is locked FOR NO KEY UPDATE SKIP LOCKED) reads the semaphore's permit
--    rows, puts the expired ones in the free set and gives them to waiters, and sets
--    next_reclaim to the first expiry it saw, at most a second ahead: O(limit) once a second
--    at most, and only while permits are short. The head waiter times its next attempt for
--    next_reclaim.
--  * The limit: grants and releases hold the semaphore's row FOR KEY SHARE (they never wait
--    for each other), SetLimit takes it FOR UPDATE. The permits are the slots 0 .. slots-1;
--    while slots <= permit_limit (always, but after a lower limit) the invariant is
--    structural: a slot is one lease row, granted only while expired, so never more than
--    permit_limit permits are unexpired. After a lower limit (slots > permit_limit) no slot
--    at or above the limit is granted again and grants count the permits (serialised by the
--    row, FOR NO KEY UPDATE), as before this migration, until every permit above the limit
--    has ended; then slots falls to the limit.
--
-- The invariant of 00008 stands: never more than permit_limit permits unexpired at once on
-- the database clock (after a lower limit: nothing is granted until fewer are).

ALTER TABLE fencelock.semaphores ADD COLUMN next_reclaim timestamptz NOT NULL DEFAULT '-infinity';
UPDATE fencelock.semaphores SET slots = greatest(slots, permit_limit);

-- The TTL a waiter asks for, which a hand-off grants it.
ALTER TABLE fencelock.semaphore_waiters ADD COLUMN ttl_us bigint NOT NULL DEFAULT 0;

CREATE TABLE fencelock.semaphore_free (
    semaphore text    NOT NULL,
    slot      integer NOT NULL,
    PRIMARY KEY (semaphore, slot)
);

-- The permit granted to a wait: found by its waiter's poll, and by the cleanup of an attempt
-- of unknown outcome, in one probe (not one per slot). Renewals do not change permit_wait,
-- so they stay HOT.
CREATE INDEX leases_permit_wait ON fencelock.leases (permit_wait) WHERE permit_wait IS NOT NULL;

INSERT INTO fencelock.semaphore_free (semaphore, slot)
SELECT s.name, g.i
FROM fencelock.semaphores AS s, pg_catalog.generate_series(0, s.permit_limit - 1) AS g(i)
WHERE NOT EXISTS (SELECT 1 FROM fencelock.leases AS l
                  WHERE l.name = s.name || '#' || g.i AND l.expires_at > pg_catalog.clock_timestamp());

SELECT fencelock.grant_to_lease_roles('SELECT, INSERT, UPDATE, DELETE', 'fencelock.semaphore_free');

-- fencelock.semaphore_give(sem, slot) grants the permit sem#slot, which the caller has ended
-- and holds locked FOR UPDATE (or found absent or expired), to the head of the queue: the
-- first live waiter, locked FOR UPDATE SKIP LOCKED (a waiter whose row is locked is passed
-- over: one being given a permit by another release, or one whose own attempt is running and
-- will find the permit itself; no release waits for another, nor for a waiter). The grant is
-- that of LeaseGrant: the row is written only while it is expired (ON CONFLICT ... WHERE,
-- under the row lock: a row an operator's force_release or a renewal changed meanwhile is not
-- overwritten), with a token drawn by next_token under that lock (larger than every earlier
-- token of the permit, a force_release's fence included; durable at commit), acquired now,
-- expiring after the TTL the waiter asked for, recorded for its wait (permit_wait). The
-- waiter's row leaves the queue, and its channel is told the grant: "<wait_id> <token>
-- <expires_at, us> <octets of holder> <holder><permit name>" (with the setting
-- fencelock.defer_notify on, the channel and payload are left in fencelock.deferred_notify for
-- the caller to send after the commit instead). Returns 0 (nobody to give it
-- to: the caller frees the slot), -1 (the permit is held after all: not free), 2 (given to a
-- waiter that polls) or 3 (given and notified).
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_give(sem text, slot integer) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    h record;
    tok bigint;
    t timestamptz := pg_catalog.clock_timestamp();
    exp timestamptz;
BEGIN
    SELECT w.wait_id, w.holder, w.channel, w.ttl_us INTO h
    FROM fencelock.semaphore_waiters AS w
    WHERE w.semaphore = sem AND w.expires_at > t AND w.ttl_us > 0
    ORDER BY w.seq
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    exp := t + h.ttl_us * interval '1 microsecond';
    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at, permit_wait)
    VALUES (sem || '#' || slot, h.holder, fencelock.next_token(false), t, exp, h.wait_id)
    ON CONFLICT ON CONSTRAINT leases_pkey DO UPDATE
        SET name = excluded.name, holder = excluded.holder, token = fencelock.next_token(false),
            acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,
            permit_wait = excluded.permit_wait
        WHERE l.expires_at <= pg_catalog.clock_timestamp()
    RETURNING l.token INTO tok;
    IF tok IS NULL THEN
        RETURN -1;
    END IF;
    DELETE FROM fencelock.semaphore_waiters AS w WHERE w.semaphore = sem AND w.wait_id = h.wait_id;
    IF h.channel IS NULL THEN
        RETURN 2;
    END IF;
    IF pg_catalog.current_setting('fencelock.defer_notify', true) = 'on' THEN
        -- The caller sends it after this transaction commits (SemaphoreRelease, then
        -- SemaphoreNotify): see semaphore_release.
        PERFORM pg_catalog.set_config('fencelock.deferred_notify', h.channel || ' ' || pg_catalog.concat_ws(' ', h.wait_id, tok,
            (EXTRACT(epoch FROM exp) * 1000000)::bigint, pg_catalog.octet_length(h.holder),
            h.holder || sem || '#' || slot), true);
        RETURN 3;
    END IF;
    PERFORM pg_catalog.pg_notify(h.channel, pg_catalog.concat_ws(' ', h.wait_id, tok,
        (EXTRACT(epoch FROM exp) * 1000000)::bigint, pg_catalog.octet_length(h.holder),
        h.holder || sem || '#' || slot));
    RETURN 3;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_dispatch(sem, lim) gives free permits below lim to waiters, one each,
-- while both are left: after SetLimit raised the limit while others wait (an operator's
-- statement; a grant wakes waiters instead, so that no waiter's statement waits for it). A free permit whose row is locked (a guarded transaction of its old holder still
-- open) is passed over; one found held is taken out of the set. When free permits are left
-- and every live waiter's row is locked (each one's own attempt is running, or another
-- release is giving it a permit), it wakes the first two, so that none sleeps on a free
-- permit. Returns how many it gave.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_dispatch(sem text, lim integer) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    i integer := -1;
    n integer := 0;
    r integer;
BEGIN
    LOOP
        SELECT f.slot INTO i FROM fencelock.semaphore_free AS f
        WHERE f.semaphore = sem AND f.slot > i AND f.slot < lim
        ORDER BY f.slot LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        CONTINUE WHEN EXISTS (SELECT 1 FROM fencelock.leases AS l WHERE l.name = sem || '#' || i)
                 AND NOT EXISTS (SELECT 1 FROM fencelock.leases AS l WHERE l.name = sem || '#' || i
                                 FOR UPDATE SKIP LOCKED);
        r := fencelock.semaphore_give(sem, i);
        IF r = 0 THEN
            PERFORM fencelock.semaphore_wake(sem, 2, pg_catalog.clock_timestamp());
            EXIT;
        END IF;
        DELETE FROM fencelock.semaphore_free AS f WHERE f.semaphore = sem AND f.slot = i;
        IF r > 0 THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_reclaim(sem, lim, n, t) puts every permit among slots 0 .. n-1 (below
-- lim) whose row is expired at t in the free set, and returns the first expiry after t among
-- the others (NULL: none). A slot with no row is left alone: it is in the free set already
-- (slots are created free, and the sweep keeps permit rows), or a grant is creating its row
-- right now (inserting a free slot for it would wait for that grant). An expired row is locked FOR UPDATE SKIP LOCKED first: a row it
-- cannot lock (a renewal in flight, whose commit may make it unexpired again; a guarded
-- transaction of its old holder) is left for the next reclaim; a row it locks cannot be
-- renewed any more (LeaseRenew rechecks the expiry after its lock). Slots at or above lim
-- are read (for the first expiry) but not freed. Returns t itself when it left an expired row
-- locked by someone (the caller then reclaims again soon, not at once: a guarded transaction
-- left open on an expired permit would make every attempt read every permit row). O(n) index
-- probes.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_reclaim(sem text, lim integer, n integer, t timestamptz) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    soonest timestamptz;
BEGIN
    WITH rd AS MATERIALIZED (
        SELECT l.name, l.expires_at FROM fencelock.leases AS l
        WHERE l.name = ANY (fencelock.semaphore_slots(sem, n))
    ), lk AS MATERIALIZED (
        SELECT l.name FROM fencelock.leases AS l
        WHERE l.name = ANY (ARRAY(SELECT rd.name FROM rd WHERE rd.expires_at <= t)) AND l.expires_at <= t
        FOR UPDATE OF l SKIP LOCKED
    ), freed AS (
        INSERT INTO fencelock.semaphore_free (semaphore, slot)
        SELECT sem, substr(lk.name, length(sem) + 2)::integer FROM lk
        WHERE substr(lk.name, length(sem) + 2)::integer < lim
        ON CONFLICT ON CONSTRAINT semaphore_free_pkey DO NOTHING
    )
    SELECT CASE WHEN (SELECT count(*) FROM rd WHERE rd.expires_at <= t) > (SELECT count(*) FROM lk) THEN t
                ELSE (SELECT min(rd.expires_at) FROM rd WHERE rd.expires_at > t) END
    INTO soonest;
    RETURN soonest;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_acquire: one attempt to take a permit of sem for holder (replaces the
-- function of migration 00008; same arguments and columns).
--  * A waiter's attempt (queue) first locks its own queue row FOR UPDATE SKIP LOCKED: while it
--    runs, no release can give this wait a permit (semaphore_give passes over a locked row),
--    so it never ends up with two, and its own writes to the row never wait. A row it cannot
--    lock is being given a permit by a release right now: it returns at once (refused, ahead
--    -1: retry now), and the NOTIFY or its next attempt brings the permit. Then a permit handed to this
--    wait (a release gave it one before) comes back as outcome 3.
--  * Waiters are served first come, first served: a wait is granted here only when no live
--    waiter is ahead of it (a try, queue = false, counts every live waiter as ahead: it never
--    takes a permit someone waits for). ahead is 1 when someone is, else 0. A waiter that is
--    not at the head only refreshes its own queue row: it locks nothing else, and waits for
--    nothing (unless a free permit is waiting for the waiters ahead: then it is told to look
--    again soon).
--  * Granted (outcome 1): a free permit below the limit, under the semaphore's row held FOR
--    KEY SHARE (grants never wait for each other; SetLimit waits for them). Its lease row is
--    locked FOR UPDATE SKIP LOCKED first (absent: inserted): a locked one (a guarded
--    transaction of its old holder still open) is passed over, and one found unexpired (on
--    the clock read under that lock) is not free after all and leaves the set. The grant is
--    written only onto an expired row, with a token drawn by next_token under the row lock
--    (larger than every earlier token of the permit; durable at commit), acquired at t and
--    expiring at t + ttl (t read after the semaphore's row lock, and after the client sent the
--    call, as its trust window needs), recorded for this wait (permit_wait: the cleanup of an
--    attempt of unknown outcome ends only its own permit). The wait's row leaves the queue;
--    when free permits are left over, the next two waiters are woken to take them.
--  * No free permit, and next_reclaim has passed: this attempt reclaims expired permits
--    (semaphore_reclaim) if no other attempt is doing so, then tries once more; next_reclaim
--    moves to the first expiry it saw, at most a second and at least 100 ms ahead.
--  * After a lower limit (slots > permit_limit) the permits are counted instead: a grant
--    happens only while fewer than the limit are unexpired (a row expired but locked by
--    someone counts as held), with the semaphore's row held FOR NO KEY UPDATE so that two
--    counting grants never both count the last permit; slots falls to the limit once no
--    permit at or above it is unexpired. A counting grant that leaves room wakes waiters for
--    it. This costs O(slots) a grant until the permits above the limit have ended.
--  * Refused (outcome 4): with queue, the wait joins the queue at the back or refreshes its
--    row (keeping its place while live). Committed with synchronous_commit off (a queue row
--    lost in a crash costs one refresh). remaining_us is the time until next_reclaim (0: retry
--    soon).
-- server_now is clock_timestamp() at the end (after the client sent the call).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_acquire(sem text, who text, wait bigint, ttl_us bigint,
    default_limit integer, queue boolean, chan text, live_us bigint)
RETURNS TABLE (outcome integer, name text, token bigint, expires_at timestamptz,
    server_now timestamptz, ahead bigint, remaining_us bigint, permit_limit integer)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
    g record;
    myseq bigint;
    n_ahead bigint := 0;
    lim integer := 0;
    hw integer;
    nr timestamptz := t;
    counting boolean := false;
    held integer := 0;
    high integer;
    i integer;
    tok bigint;
    exp timestamptz;
    granted boolean := false;
    reclaimed boolean := false;
BEGIN
    IF queue THEN
        SELECT w.seq, w.expires_at INTO myseq, exp FROM fencelock.semaphore_waiters AS w
        WHERE w.semaphore = sem AND w.wait_id = wait
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM fencelock.semaphore_waiters AS w
                                 WHERE w.semaphore = sem AND w.wait_id = wait) THEN
            -- A release is giving this wait a permit right now (ahead -1: look again at once;
            -- the release may not have seen this wait's channel yet, and then tells nobody).
            PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
            RETURN QUERY SELECT 4, NULL::text, 0::bigint, NULL::timestamptz, pg_catalog.clock_timestamp(),
                -1::bigint, 0::bigint, 0;
            RETURN;
        END IF;
        IF exp IS NULL OR exp <= t THEN -- not in the queue, or its place expired
            myseq := NULL;
        END IF;
        SELECT l.name, l.token, l.expires_at INTO g FROM fencelock.leases AS l
        WHERE l.permit_wait = wait AND l.holder = who AND l.expires_at > pg_catalog.clock_timestamp();
        IF FOUND THEN
            DELETE FROM fencelock.semaphore_waiters AS w WHERE w.semaphore = sem AND w.wait_id = wait;
            RETURN QUERY SELECT 3, g.name, g.token, g.expires_at, pg_catalog.clock_timestamp(), 0::bigint, 0::bigint, 0;
            RETURN;
        END IF;
    END IF;
    SELECT count(*) INTO n_ahead FROM (
        SELECT 1 FROM fencelock.semaphore_waiters AS w
        WHERE w.semaphore = sem AND w.wait_id <> wait AND w.expires_at > t
          AND w.seq < coalesce(myseq, 9223372036854775807)
        LIMIT 1) AS a;
    IF n_ahead = 0 THEN
        SELECT s.permit_limit, s.slots, s.next_reclaim INTO lim, hw, nr
        FROM fencelock.semaphores AS s WHERE s.name = sem FOR KEY SHARE;
        IF NOT FOUND THEN
            INSERT INTO fencelock.semaphores AS s (name, permit_limit, slots) VALUES (sem, default_limit, default_limit)
            ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
            IF FOUND THEN
                INSERT INTO fencelock.semaphore_free (semaphore, slot)
                SELECT sem, g2.i FROM pg_catalog.generate_series(0, default_limit - 1) AS g2(i)
                ON CONFLICT ON CONSTRAINT semaphore_free_pkey DO NOTHING;
            END IF;
            SELECT s.permit_limit, s.slots, s.next_reclaim INTO lim, hw, nr
            FROM fencelock.semaphores AS s WHERE s.name = sem FOR KEY SHARE;
        END IF;
        IF hw > lim THEN
            -- After a lower limit: count, one counting grant at a time.
            PERFORM 1 FROM fencelock.semaphores AS s WHERE s.name = sem FOR NO KEY UPDATE;
            SELECT s.permit_limit, s.slots INTO lim, hw FROM fencelock.semaphores AS s WHERE s.name = sem;
            counting := hw > lim;
        END IF;
        t := pg_catalog.clock_timestamp(); -- after the locks: a statement that waited decides now
        IF counting THEN
            WITH rd AS MATERIALIZED (
                SELECT l.name, l.expires_at FROM fencelock.leases AS l
                WHERE l.name = ANY (fencelock.semaphore_slots(sem, hw))
            ), lk AS MATERIALIZED (
                SELECT l.name FROM fencelock.leases AS l
                WHERE l.name = ANY (ARRAY(SELECT rd.name FROM rd WHERE rd.expires_at <= t)) AND l.expires_at <= t
                FOR UPDATE OF l SKIP LOCKED
            )
            SELECT (SELECT count(*) FROM rd) - (SELECT count(*) FROM lk),
                   (SELECT count(*) FROM rd
                    WHERE substr(rd.name, length(sem) + 2)::integer >= lim
                      AND rd.name NOT IN (SELECT lk.name FROM lk))
            INTO held, high;
            IF high = 0 THEN
                UPDATE fencelock.semaphores AS s SET slots = lim WHERE s.name = sem;
                DELETE FROM fencelock.semaphore_free AS f WHERE f.semaphore = sem AND f.slot >= lim;
            END IF;
            IF held < lim THEN
                PERFORM fencelock.semaphore_reclaim(sem, lim, lim, t);
            END IF;
        END IF;
        IF NOT counting OR held < lim THEN
            FOR attempt IN 1..2 LOOP
                i := -1;
                LOOP
                    SELECT f.slot INTO i FROM fencelock.semaphore_free AS f
                    WHERE f.semaphore = sem AND f.slot > i AND f.slot < lim
                    ORDER BY f.slot LIMIT 1
                    FOR UPDATE SKIP LOCKED;
                    EXIT WHEN NOT FOUND;
                    SELECT l.expires_at INTO exp FROM fencelock.leases AS l
                    WHERE l.name = sem || '#' || i FOR UPDATE SKIP LOCKED;
                    IF FOUND THEN
                        IF exp > pg_catalog.clock_timestamp() THEN -- held after all: not free
                            DELETE FROM fencelock.semaphore_free AS f WHERE f.semaphore = sem AND f.slot = i;
                            CONTINUE;
                        END IF;
                    ELSIF EXISTS (SELECT 1 FROM fencelock.leases AS l WHERE l.name = sem || '#' || i) THEN
                        nr := t; -- locked by someone: try again soon
                        CONTINUE;
                    END IF;
                    -- The grant starts now, after the row's lock and its expiry check: never
                    -- before the end of the permit it replaces.
                    t := pg_catalog.clock_timestamp();
                    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at, permit_wait)
                    VALUES (sem || '#' || i, who, fencelock.next_token(false), t, t + ttl_us * interval '1 microsecond', wait)
                    ON CONFLICT ON CONSTRAINT leases_pkey DO UPDATE
                        SET name = excluded.name, holder = excluded.holder, token = fencelock.next_token(false),
                            acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,
                            permit_wait = excluded.permit_wait
                        WHERE l.expires_at <= t
                    RETURNING l.token, l.expires_at INTO tok, exp;
                    CONTINUE WHEN tok IS NULL; -- created and held meanwhile
                    DELETE FROM fencelock.semaphore_free AS f WHERE f.semaphore = sem AND f.slot = i;
                    granted := true;
                    EXIT;
                END LOOP;
                EXIT WHEN granted OR reclaimed OR t < nr;
                -- No free permit: reclaim the expired ones, if no other attempt is at it.
                PERFORM 1 FROM fencelock.semaphores AS s
                WHERE s.name = sem AND s.next_reclaim <= t FOR NO KEY UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                nr := least(greatest(coalesce(fencelock.semaphore_reclaim(sem, lim, hw, t), t + interval '1 second'),
                                     t + interval '100 milliseconds'),
                            t + interval '1 second');
                UPDATE fencelock.semaphores AS s SET next_reclaim = nr WHERE s.name = sem;
                reclaimed := true;
            END LOOP;
        END IF;
        IF granted THEN
            IF queue THEN
                DELETE FROM fencelock.semaphore_waiters AS w WHERE w.semaphore = sem AND w.wait_id = wait;
            END IF;
            IF counting THEN
                IF held + 1 < lim THEN -- room left: tell the waiters behind
                    PERFORM fencelock.semaphore_wake(sem, lim - held - 1, pg_catalog.clock_timestamp());
                END IF;
            ELSIF EXISTS (SELECT 1 FROM fencelock.semaphore_free AS f WHERE f.semaphore = sem AND f.slot < lim) THEN
                -- Free permits left (a reclaim found several, or a limit was raised): wake the
                -- next two waiters to take them, each in its own statement (each granted one
                -- wakes two more while permits are left). Woken, not given: giving would lock
                -- their queue rows until this transaction ends, and a waiter's own statement
                -- (a refresh, leaving) would wait behind this one.
                PERFORM fencelock.semaphore_wake(sem, 2, pg_catalog.clock_timestamp());
            END IF;
            RETURN QUERY SELECT 1, sem || '#' || i, tok, exp, pg_catalog.clock_timestamp(), 0::bigint, 0::bigint, lim;
            RETURN;
        END IF;
    ELSIF queue AND EXISTS (SELECT 1 FROM fencelock.semaphore_free AS f WHERE f.semaphore = sem) THEN
        -- Someone is ahead, yet a permit is free (the head is taking it, or is about to be
        -- woken for it): look again soon rather than at the next refresh.
        n_ahead := 0;
        nr := t;
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    IF queue THEN
        INSERT INTO fencelock.semaphore_waiters AS w (semaphore, wait_id, holder, seq, channel, since, expires_at, ttl_us)
        VALUES (sem, wait, who, nextval('fencelock.semaphore_waiters_seq'), nullif(chan, ''), t,
                t + live_us * interval '1 microsecond', ttl_us)
        ON CONFLICT ON CONSTRAINT semaphore_waiters_pkey DO UPDATE
            SET seq = CASE WHEN w.expires_at > t THEN w.seq ELSE excluded.seq END,
                since = CASE WHEN w.expires_at > t THEN w.since ELSE excluded.since END,
                channel = excluded.channel, expires_at = excluded.expires_at, ttl_us = excluded.ttl_us;
    END IF;
    RETURN QUERY SELECT 4, NULL::text, 0::bigint, NULL::timestamptz, pg_catalog.clock_timestamp(), n_ahead,
        CASE WHEN n_ahead > 0 OR nr IS NULL OR NOT isfinite(nr) THEN 0
             ELSE greatest(0, (EXTRACT(epoch FROM nr - pg_catalog.clock_timestamp()) * 1000000)::bigint) END,
        lim;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_release(sem, slot, who, tok) ends the permit (slot, who, tok), scoped to
-- that grant (0: it had expired or been taken over; nothing changed), and gives it to the
-- head of the queue in the same statement (3: given and notified, 2: given to a waiter that
-- polls, or freed and a waiter woken), or, when nobody waits, puts it in the free set (1).
-- Replaces 00008's function.
--  * The permit row is locked FOR UPDATE SKIP LOCKED first, as fencelock.hand_off does: a row
--    someone else holds a lock on (a guarded transaction of this holder, FOR KEY SHARE; its
--    renewal in flight) is released without a hand-off, once the renewal has committed, and
--    goes to the free set; the first two waiters are woken to take it once the lock is gone.
--  * The semaphore's row is held FOR KEY SHARE: a release never waits for a grant, and
--    SetLimit waits for it. A slot at or above the limit (after a lower limit) is neither
--    given nor freed; while slots > limit (grants count) the permit is freed. Either way the
--    first two waiters are woken to count for themselves.
--  * A permit that could not be given (every live waiter's row locked: its own attempt is
--    running, or another release is giving it a permit) is freed, and the first two live
--    waiters are woken: two, so that the one behind a head that is being given another
--    permit hears of this one too.
--  * Committed with synchronous_commit off when nothing is given (a release lost in a crash
--    leaves the permit held until its TTL ends, never longer); a hand-off's token makes the
--    commit synchronous again (next_token). Row locks: its permit row's, and none another
--    transaction holds (the rest is SKIP LOCKED). It reads no other permit.
--  * The NOTIFY of a hand-off: PostgreSQL serialises the commits of transactions that NOTIFY
--    (an exclusive lock from the commit's start to its end, WAL flush included), so releases
--    that notify in their own durable commit queue one behind the other: measured, 690 waits
--    for that lock and a hand-off p50 of 188 ms with 100 permits and 200 waiters. The client's
--    release (SemaphoreRelease) sets fencelock.defer_notify, and sends the notification in a
--    statement of its own once the hand-off has committed (SemaphoreNotify, committed without
--    waiting for a flush: the lock is held for microseconds). A releaser that dies in between
--    leaves the waiter to find its permit at its next refresh.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_release(sem text, slot text, who text, tok bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
    i integer := pg_catalog.substr(slot, pg_catalog.length(sem) + 2)::integer;
    lim integer;
    hw integer;
    r integer;
    locked boolean;
BEGIN
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM fencelock.leases AS l
    WHERE l.name = slot AND l.holder = who AND l.token = tok AND l.expires_at > t
    FOR UPDATE SKIP LOCKED;
    locked := FOUND;
    IF locked THEN
        UPDATE fencelock.leases AS l SET expires_at = t WHERE l.name = slot;
    ELSE
        UPDATE fencelock.leases AS l SET expires_at = pg_catalog.clock_timestamp()
        WHERE l.name = slot AND l.holder = who AND l.token = tok AND l.expires_at > pg_catalog.clock_timestamp();
        IF NOT FOUND THEN
            RETURN 0;
        END IF;
    END IF;
    SELECT s.permit_limit, s.slots INTO lim, hw FROM fencelock.semaphores AS s WHERE s.name = sem FOR KEY SHARE;
    IF locked AND i < lim AND hw <= lim THEN
        r := fencelock.semaphore_give(sem, i);
        IF r > 0 THEN
            RETURN r;
        END IF;
    END IF;
    IF i < lim THEN
        INSERT INTO fencelock.semaphore_free (semaphore, slot) VALUES (sem, i)
        ON CONFLICT ON CONSTRAINT semaphore_free_pkey DO NOTHING;
    END IF;
    IF fencelock.semaphore_wake(sem, 2, pg_catalog.clock_timestamp()) > 0 THEN
        RETURN 2;
    END IF;
    RETURN 1;
END
$$;
-- +goose StatementEnd

-- fencelock.semaphore_leave(sem, wait, who) takes the wait out of the semaphore's queue (a
-- waiter that gave up), and gives a permit a release gave that wait meanwhile to the next
-- waiter (or frees it): semaphore_release, scoped to (holder, wait). When the wait was in the
-- queue and held no permit, it wakes the first live waiter: the one that left may have been
-- woken to take a permit it will now not take. Returns how many permits it handed on.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_leave(sem text, wait bigint, who text) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    gone boolean;
    n integer;
BEGIN
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    DELETE FROM fencelock.semaphore_waiters AS w WHERE w.semaphore = sem AND w.wait_id = wait;
    gone := FOUND;
    SELECT count(fencelock.semaphore_release(sem, l.name, l.holder, l.token)) INTO n
    FROM fencelock.leases AS l
    WHERE l.permit_wait = wait AND l.holder = who AND l.expires_at > pg_catalog.clock_timestamp();
    IF gone AND n = 0 THEN
        PERFORM fencelock.semaphore_wake(sem, 1, pg_catalog.clock_timestamp());
    END IF;
    RETURN n;
END
$$;
-- +goose StatementEnd
DROP FUNCTION fencelock.semaphore_leave(text, bigint);

-- fencelock.semaphore_set_limit(sem, n) sets the limit of sem (creating its row and its free
-- permits), under the row FOR UPDATE (it waits for grants and releases in flight, and they
-- for it). A larger limit frees the new slots that no permit holds and gives them to
-- waiters; a smaller one ends no permit: it takes the slots at or above it out of the free
-- set, and grants count the permits until those above it have ended (semaphore_acquire).
-- Returns the previous limit (0 when the row is new). Replaces 00008's function.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_set_limit(sem text, n integer) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    prev integer;
    hw integer;
BEGIN
    SELECT s.permit_limit, s.slots INTO prev, hw FROM fencelock.semaphores AS s WHERE s.name = sem FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO fencelock.semaphores AS s (name, permit_limit, slots) VALUES (sem, n, n)
        ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
        IF FOUND THEN
            INSERT INTO fencelock.semaphore_free (semaphore, slot)
            SELECT sem, g.i FROM pg_catalog.generate_series(0, n - 1) AS g(i)
            ON CONFLICT ON CONSTRAINT semaphore_free_pkey DO NOTHING;
            RETURN 0;
        END IF;
        -- created meanwhile (by a first acquire)
        SELECT s.permit_limit, s.slots INTO prev, hw FROM fencelock.semaphores AS s WHERE s.name = sem FOR UPDATE;
    END IF;
    IF n > prev THEN
        INSERT INTO fencelock.semaphore_free (semaphore, slot)
        SELECT sem, g.i FROM pg_catalog.generate_series(prev, n - 1) AS g(i)
        WHERE NOT EXISTS (SELECT 1 FROM fencelock.leases AS l
                          WHERE l.name = sem || '#' || g.i AND l.expires_at > pg_catalog.clock_timestamp())
        ON CONFLICT ON CONSTRAINT semaphore_free_pkey DO NOTHING;
    ELSIF n < prev THEN
        DELETE FROM fencelock.semaphore_free AS f WHERE f.semaphore = sem AND f.slot >= n;
    END IF;
    UPDATE fencelock.semaphores AS s
    SET permit_limit = n, slots = greatest(hw, n), updated_at = now(), next_reclaim = '-infinity'
    WHERE s.name = sem;
    IF n > prev THEN
        IF greatest(hw, n) <= n THEN
            PERFORM fencelock.semaphore_dispatch(sem, n);
        ELSE
            PERFORM fencelock.semaphore_wake(sem, n - prev, pg_catalog.clock_timestamp());
        END IF;
    END IF;
    RETURN prev;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to migration 00008's semaphores: its functions, without the free set, the hand-off
-- and the reclaim. Permits held stay held; waiters refresh into the old queue.

DROP FUNCTION fencelock.semaphore_leave(text, bigint, text);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_acquire(sem text, who text, wait bigint, ttl_us bigint,
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_release(sem text, slot text, who text, tok bigint) RETURNS integer
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_set_limit(sem text, n integer) RETURNS integer
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

DROP FUNCTION fencelock.semaphore_reclaim(text, integer, integer, timestamptz);
DROP FUNCTION fencelock.semaphore_dispatch(text, integer);
DROP FUNCTION fencelock.semaphore_give(text, integer);
DROP INDEX fencelock.leases_permit_wait;
DROP TABLE fencelock.semaphore_free;
ALTER TABLE fencelock.semaphore_waiters DROP COLUMN ttl_us;
ALTER TABLE fencelock.semaphores DROP COLUMN next_reclaim;
