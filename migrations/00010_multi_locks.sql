-- +goose Up
-- fencelock.grant_all(names, who, ttl_us) grants every lease of names to who for ttl_us
-- microseconds, all or nothing, in one call (Lessor.TryAcquireAll, multilock.go). Each lease is
-- an ordinary row of fencelock.leases with a token of its own from next_token, so it is larger
-- than every earlier token of its name; renewed, guarded, fenced and released like any lease.
--  * A pre-check in the call's first snapshot refuses a set with a member held (unexpired) or
--    waited for by someone else (a live row of fencelock.lease_waiters: a multi-lock never
--    barges past a queue), before any write or lock; remaining_us then says when the first
--    held member expires.
--  * Rows are created for members that have none (expired on arrival, token 0, as
--    LeaseEnsureRow), in one INSERT in name order (byte order, COLLATE "C"): the only waits
--    here are on rows another statement is inserting at that moment, and every statement that
--    inserts several lease rows inserts them in that one global order, so two overlapping sets
--    never wait for each other in a cycle (no deadlock).
--  * Every member row expired on the database clock is then locked FOR UPDATE SKIP LOCKED, in
--    name order; a row locked by anyone (a renewal in flight, a grant of it, a transaction-
--    scoped holder) refuses the whole set at once, never waits. Only with every member
--    locked and expired does one UPDATE grant them all; otherwise nothing is granted (the
--    placeholder rows stay, expired, for the sweep).
-- Returns one row per member granted, or one row with name NULL and token 0 when refused.
-- +goose StatementBegin
CREATE FUNCTION fencelock.grant_all(names text[], who text, ttl_us bigint)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, remaining_us bigint)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    sorted text[];
    soonest timestamptz;
    locked integer;
BEGIN
    sorted := ARRAY(SELECT DISTINCT x COLLATE "C" FROM pg_catalog.unnest(names) AS u(x) ORDER BY 1);
    SELECT min(l.expires_at) INTO soonest FROM fencelock.leases AS l
    WHERE l.name = ANY (sorted) AND l.expires_at > pg_catalog.clock_timestamp();
    IF soonest IS NOT NULL OR EXISTS (
        SELECT 1 FROM fencelock.lease_waiters AS w
        WHERE w.name = ANY (sorted) AND w.holder <> who AND w.granted_token = 0
          AND w.expires_at > pg_catalog.clock_timestamp()) THEN
        RETURN QUERY SELECT NULL::text, 0::bigint, NULL::timestamptz,
            CASE WHEN soonest IS NULL THEN 0
                 ELSE greatest(0, (EXTRACT(epoch FROM soonest - pg_catalog.clock_timestamp()) * 1000000)::bigint) END;
        RETURN;
    END IF;
    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)
    SELECT u.x, who, 0, now(), now() FROM pg_catalog.unnest(sorted) WITH ORDINALITY AS u(x, i)
    ORDER BY u.i
    ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;
    WITH lk AS (
        SELECT l.name FROM fencelock.leases AS l
        WHERE l.name = ANY (sorted) AND l.expires_at <= pg_catalog.clock_timestamp()
        ORDER BY l.name COLLATE "C"
        FOR UPDATE OF l SKIP LOCKED
    )
    SELECT count(*) INTO locked FROM lk;
    IF locked < pg_catalog.cardinality(sorted) THEN
        RETURN QUERY SELECT NULL::text, 0::bigint, NULL::timestamptz, 0::bigint;
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE fencelock.leases AS l
    SET holder = who, token = fencelock.next_token(false), acquired_at = now(),
        expires_at = now() + ttl_us * interval '1 microsecond'
    WHERE l.name = ANY (sorted)
    RETURNING l.name, l.token, l.expires_at, 0::bigint;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencelock.grant_all(text[], text, bigint);
