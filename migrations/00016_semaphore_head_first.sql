-- +goose Up
-- A release gives its permit to the head of the semaphore's queue, or frees it for the head
-- (issue 30, found by the suite's repeated runs: TestSemaphoreWaitersInOrder served waiter 1
-- before waiter 0, in 1 of 40 runs under a CPU hog on both cores, and in a quiet run of the
-- whole suite).
--
-- 00012's semaphore_give took the first live waiter whose row it could lock at once (FOR UPDATE
-- SKIP LOCKED), on the ground that a waiter whose row is locked is either being given a permit
-- by another release or running its own attempt, "which will find the permit itself". The
-- second is false: the release gave the permit to the waiter behind, so the head's attempt
-- found none, and the queue was served out of arrival order, against the promise of Semaphore
-- ("Waiters are served first come, first served"). The head's own attempt holds its row
-- whenever a release meets it refreshing its place, rechecking after it joined at the head,
-- or telling the queue its new channel once its lessor listens.
--
-- Now the two are told apart. A wait's own attempt (semaphore_acquire) locks its row FOR NO
-- KEY UPDATE instead of FOR UPDATE (it still excludes a release giving it a permit, which locks
-- FOR UPDATE, as migration 00012 needs); semaphore_give passes over a waiter whose row is locked
-- FOR UPDATE (being given a permit, granted by its own attempt, or leaving), as before, but
-- stops at one whose row its own attempt holds: it gives the permit to nobody and returns 0,
-- as when nobody waits, after telling that waiter alone to look again (a NOTIFY "try now",
-- token 0, as semaphore_wake sends). The caller puts the permit in the free set:
-- semaphore_release then wakes nobody else (a waiter behind would only be refused, and its
-- attempts, repeated at once while a permit is free, made the next release find the next head
-- busy in turn); semaphore_dispatch wakes the first two, as before. The head takes the free
-- permit with its running attempt or its next one; a waiter behind it, or a try, sees the
-- head ahead and is refused. No statement waits for a lock it did not
-- wait for before: the probe that tells the two apart (FOR KEY SHARE SKIP LOCKED) runs in a
-- subtransaction rolled back at once.
--
-- TestSemaphoreReleaseWhileHeadBusyKeepsOrder fails before this migration and passes after;
-- docs/PERFORMANCE.md (issue 30) has the hand-off figures before and after.
--
-- It also removes the two waits of one grant attempt behind another that 00015 left (see
-- fencelock.semaphore_row_key and semaphore_acquire below): a first acquire's insert of the
-- semaphore's row meeting that row committed and being updated, and a FOR NO KEY UPDATE SKIP
-- LOCKED that waits when it follows the row's update chain.

-- fencelock.semaphore_row_key(sem) is the advisory lock key (pg_advisory_xact_lock(bigint))
-- that a grant attempt holds, taken without waiting, before it locks the row of semaphore sem
-- FOR NO KEY UPDATE to count or reclaim: the 64-bit hash of the same text as
-- fencelock.semaphore_creation_key's, with seed 1 instead of 0 (a prefix of its own would not
-- do: 'fencelock.semaphores row ' || 'x' is the creation key's text for a semaphore named
-- 'row x'). Like that key, it collides with a key an application locks only by chance; such a
-- collision makes attempts busy, never wrong. SKIP LOCKED alone does not keep such an attempt from
-- waiting: when the row version its snapshot sees was updated after the snapshot was taken,
-- PostgreSQL locks the newer versions too, and waits for a transaction holding one of them
-- whatever the statement's wait policy (heap_lock_updated_tuple, "while locking updated
-- version"). With the key, no other grant attempt holds the row, and a snapshot taken after
-- the key sees the row as the last holder of the key committed it.
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_row_key(sem text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.hashtextextended('fencelock.semaphores ' || sem, 1) $$;
-- +goose StatementEnd

-- fencelock.semaphore_acquire: as in migration 00015, except that:
--  * it locks the wait's own row FOR NO KEY UPDATE SKIP LOCKED (see above);
--  * it takes the semaphore's row key before it locks the semaphore's row FOR NO KEY UPDATE
--    (counting after a lower limit, or reclaiming), and is busy, or does not reclaim, when
--    another attempt holds the key;
--  * a first acquire that took the creation key looks for the row again before it inserts it:
--    the row it did not see may have been committed meanwhile by the key's last holder, and
--    INSERT ... ON CONFLICT DO NOTHING meeting a committed row waits for any transaction that
--    is updating that row ("while inserting index tuple").
-- Both waits were found by TestSemaphoreNoAttemptWaitsOnFirstAcquires (a grant attempt seen
-- waiting on another's transaction in 1-2 of 8 isolated runs) and named by log_lock_waits.
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
    busy boolean := false;
BEGIN
    IF queue THEN
        -- FOR NO KEY UPDATE, not FOR UPDATE: a release (semaphore_give) can tell this wait's own
        -- attempt from another release giving it a permit (migration 00016).
        SELECT w.seq, w.expires_at INTO myseq, exp FROM fencelock.semaphore_waiters AS w
        WHERE w.semaphore = sem AND w.wait_id = wait
        FOR NO KEY UPDATE SKIP LOCKED;
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
            -- The first acquire creates the row and its free permits, under the semaphore's
            -- creation key: another transaction that holds the key is creating the row right
            -- now, and this attempt is busy instead of waiting for that insert.
            IF pg_catalog.pg_try_advisory_xact_lock(fencelock.semaphore_creation_key(sem)) THEN
                -- Look again first, in a snapshot taken after the key: a creator that held the
                -- key has committed the row by now. Inserting instead would meet that row, and
                -- ON CONFLICT waits for any transaction updating it (a grant reclaiming).
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
            ELSE
                busy := true;
            END IF;
        END IF;
        IF NOT busy AND hw > lim THEN
            -- After a lower limit: count, one counting grant at a time. An attempt that cannot
            -- lock the row at once (another is counting) is busy instead of waiting for it.
            -- The row key first (see fencelock.semaphore_row_key): SKIP LOCKED alone can wait.
            IF pg_catalog.pg_try_advisory_xact_lock(fencelock.semaphore_row_key(sem)) THEN
                PERFORM 1 FROM fencelock.semaphores AS s WHERE s.name = sem FOR NO KEY UPDATE SKIP LOCKED;
                counting := FOUND;
            END IF;
            IF counting THEN
                SELECT s.permit_limit, s.slots INTO lim, hw FROM fencelock.semaphores AS s WHERE s.name = sem;
                counting := hw > lim;
            ELSE
                busy := true;
            END IF;
        END IF;
    END IF;
    IF n_ahead = 0 AND NOT busy THEN
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
                -- No free permit: reclaim the expired ones, if no other attempt is at it. The
                -- row key first (see fencelock.semaphore_row_key), and only when a reclaim is
                -- due: an attempt that will not reclaim does not hold the key.
                EXIT WHEN NOT EXISTS (SELECT 1 FROM fencelock.semaphores AS s WHERE s.name = sem AND s.next_reclaim <= t);
                EXIT WHEN NOT pg_catalog.pg_try_advisory_xact_lock(fencelock.semaphore_row_key(sem));
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
    ELSIF busy THEN
        -- Nothing decided and nothing changed (ahead -1): look again at once. A wait keeps
        -- its place, if it has one, and does not take one: once the other transaction has
        -- ended, waits that found the semaphore busy come back as arrivals, and take the free
        -- permits side by side rather than one behind the other in queue order.
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
        RETURN QUERY SELECT 4, NULL::text, 0::bigint, NULL::timestamptz, pg_catalog.clock_timestamp(),
            -1::bigint, 0::bigint, coalesce(lim, 0);
        RETURN;
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

-- fencelock.semaphore_give(sem, slot) grants the permit sem#slot, which the caller has ended
-- and holds locked FOR UPDATE (or found absent or expired), to the head of the queue: the
-- first live waiter whose row it can lock FOR UPDATE at once, passing over waiters whose rows
-- are locked FOR UPDATE by someone else (each being given a permit, granted one, or leaving),
-- and giving nothing (0) when it meets a waiter whose own attempt holds its row (FOR NO KEY
-- UPDATE). The grant is that of migration 00012: the row is written only while it is expired,
-- with a token drawn by next_token under that lock, acquired now, expiring after the TTL the
-- waiter asked for, recorded for its wait (permit_wait); the waiter's row leaves the queue,
-- and its channel is told the grant. Returns 0 (nobody to give it to, or the head is busy: the
-- caller frees the slot and wakes the first waiters), -1 (the permit is held after all: not
-- free), 2 (given to a waiter that polls) or 3 (given and notified).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_give(sem text, slot integer) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    h record;
    tok bigint;
    t timestamptz := pg_catalog.clock_timestamp();
    exp timestamptz;
    own boolean;
    chosen boolean := false;
BEGIN
    -- The first live waiter whose row this can lock at once. A row locked FOR UPDATE is
    -- passed over: another release is giving that wait a permit, or its own attempt was
    -- granted one and is deleting the row, or it is leaving. A row locked only FOR NO KEY
    -- UPDATE is its own attempt's (semaphore_acquire), which looks for a free permit: the
    -- permit is given to nobody (0), so that the caller frees it for that waiter, and wakes
    -- it. Told apart by FOR KEY SHARE, which only FOR UPDATE blocks, taken in a
    -- subtransaction rolled back at once, so that no lock of it outlives the probe.
    FOR h IN SELECT w.wait_id, w.holder, w.channel, w.ttl_us
             FROM fencelock.semaphore_waiters AS w
             WHERE w.semaphore = sem AND w.expires_at > t AND w.ttl_us > 0
             ORDER BY w.seq LOOP
        PERFORM 1 FROM fencelock.semaphore_waiters AS w
        WHERE w.semaphore = sem AND w.wait_id = h.wait_id
        FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            chosen := true;
            EXIT;
        END IF;
        own := false;
        BEGIN
            PERFORM 1 FROM fencelock.semaphore_waiters AS w
            WHERE w.semaphore = sem AND w.wait_id = h.wait_id
            FOR KEY SHARE SKIP LOCKED;
            own := FOUND;
            RAISE EXCEPTION USING ERRCODE = 'FL016'; -- roll the probe's lock back
        EXCEPTION WHEN SQLSTATE 'FL016' THEN
            NULL;
        END;
        IF own THEN
            -- Tell that waiter alone to look again ("try now", as semaphore_wake says it): it
            -- finds the permit free. fencelock.give_busy tells the caller so, which then wakes
            -- nobody else (a waiter behind would only be refused, and look again at once).
            IF h.channel IS NOT NULL THEN
                PERFORM pg_catalog.pg_notify(h.channel, pg_catalog.concat_ws(' ', h.wait_id, 0, 0,
                    pg_catalog.octet_length(h.holder), h.holder || sem));
            END IF;
            PERFORM pg_catalog.set_config('fencelock.give_busy', 'on', true);
            RETURN 0;
        END IF;
    END LOOP;
    IF NOT chosen THEN
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

-- fencelock.semaphore_release(sem, slot, who, tok): as in migration 00012, except that when
-- semaphore_give met a waiter whose own attempt is running (and told that waiter to look
-- again), the permit is freed for it and nobody else is woken: a waiter behind it would only
-- be refused, and its attempts, repeated at once while the permit is free, made the next
-- release find the next head busy in turn.
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
    PERFORM pg_catalog.set_config('fencelock.give_busy', '', true);
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
    IF pg_catalog.current_setting('fencelock.give_busy', true) = 'on' THEN
        -- semaphore_give met a waiter whose own attempt is running, and told it alone
        -- (migration 00016): it takes the permit freed here.
        RETURN 2;
    END IF;
    IF fencelock.semaphore_wake(sem, 2, pg_catalog.clock_timestamp()) > 0 THEN
        RETURN 2;
    END IF;
    RETURN 1;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to migration 00015's semaphore_acquire and 00012's semaphore_give and semaphore_release.

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
    busy boolean := false;
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
            -- The first acquire creates the row and its free permits, under the semaphore's
            -- creation key: another transaction that holds the key is creating the row right
            -- now, and this attempt is busy instead of waiting for that insert.
            IF pg_catalog.pg_try_advisory_xact_lock(fencelock.semaphore_creation_key(sem)) THEN
                INSERT INTO fencelock.semaphores AS s (name, permit_limit, slots) VALUES (sem, default_limit, default_limit)
                ON CONFLICT ON CONSTRAINT semaphores_pkey DO NOTHING;
                IF FOUND THEN
                    INSERT INTO fencelock.semaphore_free (semaphore, slot)
                    SELECT sem, g2.i FROM pg_catalog.generate_series(0, default_limit - 1) AS g2(i)
                    ON CONFLICT ON CONSTRAINT semaphore_free_pkey DO NOTHING;
                END IF;
                SELECT s.permit_limit, s.slots, s.next_reclaim INTO lim, hw, nr
                FROM fencelock.semaphores AS s WHERE s.name = sem FOR KEY SHARE;
            ELSE
                busy := true;
            END IF;
        END IF;
        IF NOT busy AND hw > lim THEN
            -- After a lower limit: count, one counting grant at a time. An attempt that cannot
            -- lock the row at once (another is counting) is busy instead of waiting for it.
            PERFORM 1 FROM fencelock.semaphores AS s WHERE s.name = sem FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                SELECT s.permit_limit, s.slots INTO lim, hw FROM fencelock.semaphores AS s WHERE s.name = sem;
                counting := hw > lim;
            ELSE
                busy := true;
            END IF;
        END IF;
    END IF;
    IF n_ahead = 0 AND NOT busy THEN
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
    ELSIF busy THEN
        -- Nothing decided and nothing changed (ahead -1): look again at once. A wait keeps
        -- its place, if it has one, and does not take one: once the other transaction has
        -- ended, waits that found the semaphore busy come back as arrivals, and take the free
        -- permits side by side rather than one behind the other in queue order.
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
        RETURN QUERY SELECT 4, NULL::text, 0::bigint, NULL::timestamptz, pg_catalog.clock_timestamp(),
            -1::bigint, 0::bigint, coalesce(lim, 0);
        RETURN;
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_give(sem text, slot integer) RETURNS integer
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

DROP FUNCTION fencelock.semaphore_row_key(text);
