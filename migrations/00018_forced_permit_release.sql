-- +goose Up
-- A forced release of a semaphore's permit goes to the head of the semaphore's queue, as the
-- holder's own release does (issue 39, item 5).
--
-- A permit is the lease <semaphore>#<slot>. force_release handed a lease on only through the
-- lease queue of its name (fencelock.hand_off), which is empty for a permit: its waiters queue
-- in fencelock.semaphore_waiters. So a forced release of a permit gave it to nobody and told
-- nobody; the slot, expired and not in the free set, waited for the head's next reclaim (627 to
-- 917 ms measured), and the command answered "handed_to: null" while the head waited.
--
-- Now force_release ends a held permit with fencelock.semaphore_release, under the row lock it
-- holds already: the permit goes to the head of the semaphore's queue with a fresh token (and
-- its NOTIFY), or, when the head's own attempt is running at that instant or nobody listens,
-- is freed and the head told to take it, exactly as a release by its holder. The result says
-- which: handed_to names the waiter the permit was given to (new_token is its grant's), woken
-- the head that was told to take the freed permit (new_token then only fences the old holder
-- out). semaphore_release relaxes synchronous_commit for the holder's release; a forced release
-- keeps the caller's setting (the hand-off's grant and the fences are durable as before).
--
-- The return type gains a column (woken), so the function is dropped and created again; it is
-- EXECUTE to PUBLIC, as before.

-- +goose StatementBegin
DROP FUNCTION fencelock.force_release(text, text[], bigint);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION fencelock.force_release(lease_name text, fence text[], expected_token bigint DEFAULT NULL)
RETURNS TABLE(old_holder text, old_token bigint, lapsed boolean, new_token bigint, handed_to text, woken text)
LANGUAGE plpgsql
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
DECLARE
    cur record;
    outcome integer;
    sem text;
    sync text;
    now_l record;
BEGIN
    LOOP
        INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
        VALUES (lease_name, 'fencelock force-release', 0, pg_catalog.now(), pg_catalog.now())
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
    -- A permit: <semaphore>#<slot> of an existing semaphore (its name up to the last '#').
    IF lease_name ~ '#[0-9]+$' THEN
        SELECT s.name INTO sem FROM fencelock.semaphores AS s
        WHERE s.name = pg_catalog.left(lease_name, pg_catalog.length(lease_name) - pg_catalog.strpos(pg_catalog.reverse(lease_name), '#'));
    END IF;
    IF cur.held AND sem IS NOT NULL THEN
        sync := pg_catalog.current_setting('synchronous_commit');
        outcome := fencelock.semaphore_release(sem, lease_name, cur.holder, cur.token);
        PERFORM pg_catalog.set_config('synchronous_commit', sync, true);
        SELECT l.token, l.holder, l.expires_at > pg_catalog.clock_timestamp() AS live INTO now_l
        FROM fencelock.leases AS l WHERE l.name = lease_name;
        IF outcome IN (2, 3) AND now_l.live AND now_l.token > cur.token THEN
            -- semaphore_give granted the permit to the head.
            new_token := now_l.token;
            handed_to := now_l.holder;
        ELSIF outcome > 0 THEN
            -- Freed: the head of the queue, if any, was told to take it.
            SELECT w.holder INTO woken FROM fencelock.semaphore_waiters AS w
            WHERE w.semaphore = sem AND w.expires_at > pg_catalog.clock_timestamp()
            ORDER BY w.seq LIMIT 1;
        END IF;
        IF handed_to IS NULL THEN
            new_token := fencelock.next_token(false);
            UPDATE fencelock.leases AS l
            SET token = new_token, holder = 'fencelock force-release', expires_at = least(l.expires_at, pg_catalog.clock_timestamp())
            WHERE l.name = lease_name;
        END IF;
    ELSE
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
    END IF;
    INSERT INTO fencelock.fences AS f (resource, token)
    SELECT DISTINCT r, new_token FROM pg_catalog.unnest(fence) AS r
    ON CONFLICT (resource) DO UPDATE SET token = greatest(f.token, excluded.token);
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to migration 00005's force_release (pinned by 00017), which hands on through the lease
-- queue only.

-- +goose StatementBegin
DROP FUNCTION fencelock.force_release(text, text[], bigint);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION fencelock.force_release(lease_name text, fence text[], expected_token bigint DEFAULT NULL)
RETURNS TABLE(old_holder text, old_token bigint, lapsed boolean, new_token bigint, handed_to text)
LANGUAGE plpgsql
SET search_path = pg_catalog, fencelock, pg_temp
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
