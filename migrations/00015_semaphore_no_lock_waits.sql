-- +goose Up
-- No grant attempt waits for another's lock on a semaphore's row (issue 30). Migration 00012
-- took waiters off each other's locks, but two waits were left, both in
-- fencelock.semaphore_acquire, both of one grant attempt behind another's transaction (that is,
-- behind its grant, its token's synchronous commit and its NOTIFY):
--
--  * The count after a lower limit: while permits above a limit that SetLimit lowered are
--    held (slots > permit_limit), every attempt at the head of the queue, every try and every
--    wait that arrives at an empty queue locked the semaphore's row FOR NO KEY UPDATE
--    (00012's semaphore_acquire, PL/pgSQL line 65, "PERFORM 1 FROM fencelock.semaphores ...
--    FOR NO KEY UPDATE"), so counting attempts queued one behind the other. Measured
--    (BenchmarkSemaphoreWaitersLoweredLimit, limit lowered from 16 to 8 with slot 15 held, 64
--    waiters over three pools, 2,000 grants): up to 63 backends waiting for a lock at once,
--    3.9 on average over 1,376 samples 5 ms apart, 4,384 sampled waits of one attempt for
--    another's lock (docs/PERFORMANCE.md, issue 30).
--  * The creation: the first acquires of a semaphore that has no row each inserted it
--    (line 53, "INSERT INTO fencelock.semaphores ... ON CONFLICT DO NOTHING"), and an INSERT
--    that meets a row another transaction is inserting waits for that transaction to end.
--    Measured (BenchmarkSemaphoreFirstAcquires, 64 lessors making the first acquires of a new
--    semaphore of limit 64 at once, 300 rounds): up to 63 waiting at once, 2.3 on average over
--    1,836 samples, 1,520 sampled waits of one attempt for another's insert.
--
-- Now neither waits; an attempt that would have is busy instead: nothing is decided or
-- changed (a wait keeps the place it has, and takes none), and the attempt returns at once,
-- refused with ahead -1 ("look again at once", as when a release is giving this wait a
-- permit). The client looks again after its first backoff pause (at most 20 ms); a
-- Semaphore.TryAcquire does so for at most a second, then answers ErrNotAcquired.
--
--  * The count takes the row FOR NO KEY UPDATE SKIP LOCKED. Counting grants stay serialised
--    (only the attempt holding the row counts; two never both count the last permit), so the
--    invariant of 00008 stands: nothing is granted while the limit or more are unexpired. An
--    attempt told busy looks again at once; the one counting wakes the waiters for any room
--    its grant leaves (as before).
--  * A first acquire creates the row under a transaction-scoped advisory lock on the
--    semaphore's creation key (fencelock.semaphore_creation_key), taken with
--    pg_try_advisory_xact_lock: a first acquire that cannot take it at once is busy. Every
--    transaction that inserts a row of fencelock.semaphores (semaphore_acquire,
--    semaphore_set_limit) holds the key from before its insert until it ends, so the insert of
--    the one that holds it never meets another's insert in progress, and never waits: the row
--    it meets, if any, is committed (and the key was released after the commit became
--    visible). semaphore_set_limit takes the key with pg_advisory_xact_lock (an operator's
--    statement may wait for a first acquire's creation; no first acquire waits for it).
--    The row and its free permits are created as before; only who creates them changed. A
--    session that holds an advisory lock on the same int64 key (a 64-bit hash: by chance,
--    about 2^-64 for a given pair of keys) makes the semaphore's first acquires busy, and its
--    first SetLimit wait, until it lets the key go.
--
-- The rest of semaphore_acquire is 00012's: the free set, the grant (its token from
-- next_token under the permit row's lock, durable at commit), the hand-off, the reclaim and
-- FIFO service are untouched. Locks a grant attempt still waits for, none of them another
-- grant attempt's row or insert: the semaphore's row while SetLimit holds it FOR UPDATE (an
-- operator's statement, which itself waits for the grants in flight); the extension of a
-- table (fencelock.leases when the first grants of new permits insert their rows); and, at
-- commit, PostgreSQL's lock on notifying commits (a grant that wakes waiters NOTIFYs).

-- fencelock.semaphore_creation_key(sem) is the advisory lock key (pg_advisory_xact_lock(bigint))
-- that a transaction holds while it creates the row of semaphore sem: a 64-bit hash of the
-- name with a prefix of its own (two semaphores whose keys collide are only created one at a
-- time; a key an application locks, by fencelock.SHA256KeyHash or its own, collides with it
-- only by chance).
-- +goose StatementBegin
CREATE FUNCTION fencelock.semaphore_creation_key(sem text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.hashtextextended('fencelock.semaphores ' || sem, 0) $$;
-- +goose StatementEnd

-- fencelock.semaphore_acquire: one attempt to take a permit of sem for holder, as in
-- migration 00012 (same arguments, columns and outcomes), except that it waits for no other
-- attempt's lock on the semaphore's row:
--  * A first acquire (no row yet) creates the row and its free permits under the semaphore's
--    creation key, taken without waiting; when another transaction holds the key (it is
--    creating the row), the attempt is busy.
--  * After a lower limit (slots > permit_limit) the attempt counts only if it can lock the
--    semaphore's row FOR NO KEY UPDATE at once (SKIP LOCKED); when another attempt holds it
--    (counting, or reclaiming), the attempt is busy.
--  * Busy: refused (outcome 4) with ahead -1 and remaining_us 0, nothing granted or changed
--    (a wait keeps the place it has, and takes none): look again at once. Committed with
--    synchronous_commit off (it wrote nothing). permit_limit is 0 when the row is not there
--    yet. Why a busy wait takes no place: the first acquires of a semaphore, told busy while
--    one of them creates it, would otherwise all join the queue, and then be granted one
--    after the other in queue order (measured once: rounds of 64 first acquires of a semaphore
--    of 64 took 86 ms at the median, against 52 ms before this migration); as arrivals they
--    take free permits side by side (SKIP LOCKED).
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

-- fencelock.semaphore_set_limit(sem, n): as in migration 00012, except that it creates a
-- missing row under the semaphore's creation key (pg_advisory_xact_lock: it waits for a first
-- acquire that is creating the row; a first acquire meanwhile is busy, and does not wait for
-- this insert).
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
        -- Created under the creation key, as a first acquire does: a first acquire meanwhile is
        -- busy instead of waiting for this insert (this waits for one's creation to end).
        PERFORM pg_catalog.pg_advisory_xact_lock(fencelock.semaphore_creation_key(sem));
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
-- Back to migration 00012's semaphore_acquire and semaphore_set_limit.

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

DROP FUNCTION fencelock.semaphore_creation_key(text);
