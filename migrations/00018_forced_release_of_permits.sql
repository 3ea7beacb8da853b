-- +goose Up
-- Issue 39, item 5: a forced release of a semaphore's permit (fencelock release --force, the
-- live view's) releases it as its holder's release does: fencelock.semaphore_release gives it
-- to the head of the semaphore's queue with a fresh token, or frees it and wakes the head.
-- Before, force_release handed off only through the lease queue of the permit's name, which is
-- empty: the head waited until its own next look (627-917 ms), and the command answered
-- handed_to null while it waited (TestForcedReleaseOfPermitGoesToTheHead). A permit that had
-- already lapsed by its TTL goes to the waiters at the semaphore's next reclaim, as before.

-- +goose StatementBegin
-- fencelock.force_release: as in migration 00005, with the permit case above.
CREATE OR REPLACE FUNCTION fencelock.force_release(lease_name text, fence text[], expected_token bigint DEFAULT NULL::bigint) RETURNS TABLE(old_holder text, old_token bigint, lapsed boolean, new_token bigint, handed_to text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
DECLARE
    cur record;
    outcome integer;
    sem text;
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
    IF cur.held AND lease_name ~ '#[0-9]+$' THEN
        -- A permit of a semaphore (its name, '#', its slot): released as its holder's release
        -- does, which gives it to the head of the semaphore's queue, or frees it and wakes the
        -- head (fencelock.semaphore_release). The permit's row is this transaction's already.
        SELECT s.name INTO sem FROM fencelock.semaphores AS s
        WHERE s.name = pg_catalog.left(lease_name, pg_catalog.length(lease_name) - pg_catalog.strpos(pg_catalog.reverse(lease_name), '#'));
    END IF;
    IF sem IS NOT NULL THEN
        PERFORM fencelock.semaphore_release(sem, lease_name, cur.holder, cur.token);
        SELECT CASE WHEN l.token <> cur.token AND l.expires_at > pg_catalog.clock_timestamp() THEN 2 ELSE 1 END
        INTO outcome FROM fencelock.leases AS l WHERE l.name = lease_name;
    ELSIF cur.held THEN
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
    SELECT DISTINCT r, new_token FROM pg_catalog.unnest(fence) AS r
    ON CONFLICT (resource) DO UPDATE SET token = greatest(f.token, excluded.token);
    RETURN NEXT;
END
$$;
-- +goose StatementEnd
