-- +goose Up
-- A forced release that hands a permit to the head of its semaphore's queue is durable where
-- synchronous_commit is off (the server's, the role's or the session's default).
--
-- force_release (00018) ends a held permit with fencelock.semaphore_release, which relaxes
-- synchronous_commit to off for a holder's release; when it gives the permit to the head, the
-- hand-off's token (fencelock.next_token) raises it to on again, as every grant does. 00018
-- then restored the caller's setting: with "off" there, the hand-off committed without waiting
-- for its flush, and a crash undid it after it was reported, leaving the old holder's grant
-- in place, which renews and is trusted beside the head's (TestForcedPermitHandOffDurableAfterCrash).
-- Now the caller's setting is restored unless it is off and the release drew a token; then it
-- stays on. The freed path draws its fencing token after the restore, and next_token raises
-- it there, as before; the lease path (fencelock.hand_off) never relaxed it.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.force_release(lease_name text, fence text[], expected_token bigint DEFAULT NULL)
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
        -- The caller's setting back, unless it is off and the release drew a token (a hand-off
        -- to the head): next_token raised it to on, and that commit must be durable (00019).
        PERFORM pg_catalog.set_config('synchronous_commit',
            CASE WHEN sync = 'off' AND pg_catalog.current_setting('synchronous_commit') <> 'off' THEN 'on' ELSE sync END, true);
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
-- Back to migration 00018's force_release.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.force_release(lease_name text, fence text[], expected_token bigint DEFAULT NULL)
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
