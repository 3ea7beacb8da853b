-- +goose Up
-- Issue 38: fencelock's SQL hardened as a well-kept extension's is (docs/SECURITY.md).
--
-- 1. Every function of schema fencelock runs with a pinned search_path: pg_catalog, then
--    fencelock, then pg_temp (the loop at the end, which covers the functions of earlier
--    migrations and of this one). The functions run as their caller (SECURITY INVOKER), and
--    PostgreSQL resolves an operator or function along the caller's search_path, preferring an
--    exact match in any schema over pg_catalog's inexact one: a role with CREATE on a schema of
--    that path (public, before PostgreSQL 15) could plant public.*(bigint, interval) and run
--    its code with the caller's privileges inside try_acquire or renew (the class of
--    CVE-2018-1058). A function's SET clause restores only search_path at its exit: the
--    transaction-local synchronous_commit that fence, next_token and the trigger raise, and
--    set_token's fencelock.token, outlive the call (TestPinnedSearchPathKeepsLocalSettings).
--    A migration that later replaces a function must give it the same SET clause
--    (TestEveryFunctionPinsSearchPath fails otherwise).
-- 2. Tokens never issued are refused (SQLSTATE FL008, fencelock.ErrTokenNotIssued):
--    fencelock.issued_bound() is the largest token this database can have issued, (the
--    highest epoch it has drawn in << 47) | the token sequence's last value; fence, set_token,
--    the trigger, FenceAdvance and UpdateFencedTx refuse a token above it before they write.
--    A high-water mark already above it (written before this migration) is never issued
--    either: fence, FenceAdvance and the trigger let a legitimate token replace it.
-- 3. protect_table protects the inheritance children tbl has when it runs (a partitioned
--    table's partitions get the trigger from PostgreSQL, attached later ones too);
--    unprotect_table removes what it attached.
-- 4. try_acquire and grant_all date a takeover as the Go grant (LeaseGrant) does: from the end
--    of the grant it replaces, never before.

-- The statements below name everything they use by schema; this keeps a caller's search_path
-- out of the migration itself (fencelock.Migrate pins it for every migration too).
SET LOCAL search_path TO pg_catalog, pg_temp;

-- +goose StatementBegin
-- fencelock.issued_bound returns an upper bound of every token this database has issued:
-- (the highest epoch a token was drawn in << 47) | the last value of fencelock.leases_token_seq,
-- a bigint > 0; NULL on a hot standby (it writes nothing). The highest epoch is the larger of
-- the server's (timeline plus epoch_offset, which next_token draws in) and the highest one
-- recorded (token_epoch.last_epoch and token_epoch_marks: after pg_upgrade or a logical copy
-- the timeline may be lower than the epochs already issued). Every token is (epoch << 47) | s
-- with s from the one sequence, so no issued token is larger; the next grant's is. SECURITY
-- DEFINER (its owner's privileges, for a writer of a protected table with no grant on schema
-- fencelock's tables), read-only.
CREATE OR REPLACE FUNCTION fencelock.issued_bound() RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
DECLARE
    v_bound bigint;
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        RETURN NULL;
    END IF;
    -- fencelock.timeline()'s expression, written out: a call costs a function's setup.
    SELECT (greatest(('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint
                     + coalesce(e.epoch_offset, 0), e.last_epoch, k.top)::bigint << 47)
           | coalesce(pg_catalog.pg_sequence_last_value('fencelock.leases_token_seq'::regclass), 0)
    INTO v_bound
    FROM (SELECT max(m.epoch) AS top FROM fencelock.token_epoch_marks AS m) AS k
    LEFT JOIN fencelock.token_epoch AS e ON e.id;
    RETURN v_bound;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.check_issued returns token, or raises FL008 when it is larger than every token
-- this database has issued (fencelock.issued_bound): a token no grant returned, which would
-- pass every fence and then refuse every legitimate holder's write. VOLATILE: a statement
-- that calls it for its error must not have the call planned away.
CREATE OR REPLACE FUNCTION fencelock.check_issued(token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
BEGIN
    IF check_issued.token > fencelock.issued_bound() THEN
        RAISE EXCEPTION 'fencelock: fencing token % was never issued by this database: it is larger than every token granted',
            check_issued.token
            USING ERRCODE = 'FL008',
                  HINT = 'a fencing token comes from a grant (a lease, a term, a permit, an advisory lock with tokens); never make one up';
    END IF;
    RETURN check_issued.token;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.fence: as in migration 00014, and refuses a token never issued (FL008) before it
-- writes; a high-water mark above every issued token (written before migration 00017) is
-- replaced by the caller's token.
CREATE OR REPLACE FUNCTION fencelock.fence(resource text, token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
DECLARE
    v_current bigint;
BEGIN
    IF (pg_catalog.octet_length(fence.resource) BETWEEN 1 AND 1024 AND fence.token > 0) IS NOT TRUE THEN
        PERFORM fencelock.check_text('resource', fence.resource), fencelock.check_token(fence.token);
    END IF;
    PERFORM fencelock.check_issued(fence.token);
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    INSERT INTO fencelock.fences AS f (resource, token)
    VALUES (fence.resource, fence.token)
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE SET token = excluded.token
    WHERE f.token <= excluded.token OR f.token > fencelock.issued_bound()
    RETURNING f.token INTO v_current;
    IF v_current IS NULL THEN
        SELECT f.token INTO v_current FROM fencelock.fences AS f WHERE f.resource = fence.resource;
        RAISE EXCEPTION 'fencelock: stale fencing token % for resource %: high-water mark is %',
            fence.token, pg_catalog.quote_literal(fence.resource), v_current
            USING ERRCODE = 'FL004', DETAIL = pg_catalog.format('current=%s', v_current);
    END IF;
    RETURN fence.token;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.set_token: as in migration 00014, and refuses a token never issued (FL008).
CREATE OR REPLACE FUNCTION fencelock.set_token(token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
BEGIN
    PERFORM fencelock.check_token(token), fencelock.check_issued(token);
    PERFORM pg_catalog.set_config('fencelock.token', token::text, true);
    RETURN token;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.refuse_stale_writes: as in migration 00014, and
--   * a token that would raise the row's (an INSERT's, or one larger than the row carries) is
--     refused with FL008 when it was never issued (fencelock.check_issued; with a resource,
--     fencelock.fence checks it);
--   * a row whose token column holds a token never issued (written before migration 00017)
--     does not refuse a smaller token: that value proves no newer grant. Both read
--     fencelock.issued_bound, which a writer reaches only with USAGE on schema fencelock: a
--     writer without it is refused (42501) when its token would raise the row's, and refused
--     as stale (FL004) when the row's is larger, made up or not (docs/SECURITY.md).
CREATE OR REPLACE FUNCTION fencelock.refuse_stale_writes() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
-- Lean on purpose: it runs for every row written, and each statement and expression of a
-- plpgsql function costs its setup again in every transaction (no exception block, and the
-- check_* helpers only where a write raises the row's token or refuses it: each call costs
-- about 14 us for check_issued, docs/PERFORMANCE.md, issue 38).
DECLARE
    v_setting text := pg_catalog.current_setting('fencelock.token', true);
    v_token bigint;
    v_old bigint;
    v_new bigint;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        v_old := (pg_catalog.to_jsonb(OLD) ->> TG_ARGV[0])::bigint;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new := (pg_catalog.to_jsonb(NEW) ->> TG_ARGV[0])::bigint;
    END IF;
    IF v_setting <> '' THEN
        IF v_setting !~ '^[0-9]{1,19}$' OR (pg_catalog.length(v_setting) = 19 AND v_setting COLLATE "C" > '9223372036854775807') THEN
            RAISE EXCEPTION 'fencelock: setting fencelock.token is %, not a fencing token', pg_catalog.quote_literal(v_setting)
                USING ERRCODE = 'FL007';
        END IF;
        v_token := v_setting::bigint;
    ELSIF v_new IS DISTINCT FROM v_old THEN -- an INSERT's column, or an UPDATE that changed it
        v_token := v_new;
    END IF;
    IF v_token IS NULL THEN
        RAISE EXCEPTION 'fencelock: % on %.% carries no fencing token', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'FL006',
                  HINT = pg_catalog.format('SELECT fencelock.set_token(<token>) in the same transaction, or set column %I', TG_ARGV[0]);
    ELSIF v_token <= 0 THEN
        RAISE EXCEPTION 'fencelock: fencing token must be > 0, got %', v_token USING ERRCODE = 'FL007';
    ELSIF v_old > v_token THEN
        -- Read the bound only for a writer that may (USAGE on schema fencelock: each statement
        -- of PL/pgSQL is parsed when first reached, and the call's lookup needs it); any other
        -- is refused as stale, as before migration 00017.
        IF pg_catalog.has_schema_privilege('fencelock', 'USAGE') THEN
            IF v_old > fencelock.issued_bound() THEN
                v_old := NULL; -- never issued: proves no newer grant
            END IF;
        END IF;
        IF v_old IS NOT NULL THEN
            RAISE EXCEPTION 'fencelock: stale fencing token % for table %.%: the row carries token %',
                v_token, TG_TABLE_SCHEMA, TG_TABLE_NAME, v_old
                USING ERRCODE = 'FL004', DETAIL = pg_catalog.format('current=%s', v_old);
        END IF;
    END IF;
    -- A token that raises the row's (fencelock.fence checks it where there is a resource).
    IF (v_old IS NULL OR v_token > v_old) AND TG_ARGV[1] = '' THEN
        PERFORM fencelock.check_issued(v_token);
    END IF;
    IF TG_ARGV[1] <> '' THEN
        PERFORM fencelock.fence(TG_ARGV[1], v_token); -- raises synchronous_commit too
    ELSIF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    ELSIF v_new IS DISTINCT FROM v_token THEN
        NEW := pg_catalog.jsonb_populate_record(NEW, pg_catalog.jsonb_build_object(TG_ARGV[0], v_token));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.protect_table: as in migration 00014, on tbl and on every inheritance child tbl
-- has when it runs (children of children too), with the same token column and resource
-- (replacing a child's own trigger of that name): PostgreSQL fires the row triggers of the
-- table that stores the row, so a write through tbl to a child's row checks nothing unless
-- the child has the trigger. Partitions are left to PostgreSQL, which clones a partitioned
-- table's trigger onto its partitions, those attached later included. A child created later
-- is protected when protect_table runs again (docs/SQL.md). Needs what CREATE TRIGGER needs on
-- each table; a child it may not change fails the whole call (nothing is attached).
CREATE OR REPLACE FUNCTION fencelock.protect_table(tbl regclass, token_column name DEFAULT 'fence_token', resource text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
DECLARE
    r regclass;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute AS a
                   WHERE a.attrelid = tbl::oid AND a.attname = token_column AND a.attnum > 0
                     AND NOT a.attisdropped AND a.atttypid = 'pg_catalog.int8'::pg_catalog.regtype::oid) THEN
        RAISE EXCEPTION 'fencelock: % has no bigint column %', tbl, pg_catalog.quote_ident(token_column)
            USING ERRCODE = 'FL007';
    END IF;
    IF resource IS NOT NULL THEN
        PERFORM fencelock.check_text('resource', resource);
    END IF;
    FOR r IN SELECT t.rel FROM fencelock.inheritance_tree(tbl) AS t LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS fencelock_refuse_stale_writes ON %s', r);
        EXECUTE pg_catalog.format('CREATE TRIGGER fencelock_refuse_stale_writes BEFORE INSERT OR UPDATE OR DELETE ON %s '
                                  'FOR EACH ROW EXECUTE FUNCTION fencelock.refuse_stale_writes(%L, %L)',
                                  r, token_column, coalesce(resource, ''));
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.unprotect_table removes the trigger protect_table attached to tbl and to its
-- inheritance children, if any.
CREATE OR REPLACE FUNCTION fencelock.unprotect_table(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
DECLARE
    r regclass;
BEGIN
    FOR r IN SELECT t.rel FROM fencelock.inheritance_tree(tbl) AS t LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS fencelock_refuse_stale_writes ON %s', r);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.inheritance_tree returns tbl and its inheritance descendants, parents before
-- children, leaving out partitions (a partitioned table's row triggers reach them through
-- PostgreSQL): the tables protect_table and unprotect_table attach to and detach from.
CREATE OR REPLACE FUNCTION fencelock.inheritance_tree(tbl regclass) RETURNS TABLE(rel regclass, depth integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
    WITH RECURSIVE tree(rel, depth) AS (
        SELECT tbl::oid, 0
        UNION ALL
        SELECT i.inhrelid, t.depth + 1
        FROM tree AS t
        JOIN pg_catalog.pg_inherits AS i ON i.inhparent = t.rel
        JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
        WHERE NOT c.relispartition
    )
    SELECT t.rel::regclass, t.depth FROM tree AS t ORDER BY t.depth, t.rel
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.try_acquire: as in migration 00014, and a takeover (the DO UPDATE of an expired
-- row) starts at the later of the statement's start and the end of the grant it replaces, as
-- LeaseGrant's does (excluded.acquired_at is the statement's start, excluded.expires_at -
-- excluded.acquired_at the TTL): a call that waited for a lock across the old grant's expiry
-- dated the new grant up to that wait before the old one ended
-- (TestEveryGrantPathStartsAfterTheGrantItReplaces).
CREATE OR REPLACE FUNCTION fencelock.try_acquire(lease_name text, lease_holder text, ttl interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
DECLARE
    v_ttl_us bigint;
    v_token bigint;
BEGIN
    IF (pg_catalog.octet_length(lease_name) BETWEEN 1 AND 1024 AND pg_catalog.octet_length(lease_holder) BETWEEN 1 AND 1024
        AND EXTRACT(epoch FROM ttl) BETWEEN 0.01::numeric AND 604800::numeric) IS NOT TRUE THEN
        PERFORM fencelock.check_text('lease_name', lease_name), fencelock.check_text('lease_holder', lease_holder),
                fencelock.ttl_us(ttl);
    END IF;
    v_ttl_us := (EXTRACT(epoch FROM ttl) * 1000000::numeric)::bigint;
    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)
    SELECT lease_name, lease_holder,
           CASE WHEN EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = lease_name)
                THEN 0::bigint ELSE fencelock.next_token(false) END,
           pg_catalog.statement_timestamp(),
           pg_catalog.statement_timestamp() + v_ttl_us::double precision * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur
                      WHERE cur.name = lease_name AND cur.expires_at > pg_catalog.clock_timestamp())
      AND (NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = lease_name)
           OR EXISTS (SELECT 1 FROM fencelock.leases AS cur
                      WHERE cur.name = lease_name AND cur.expires_at <= pg_catalog.clock_timestamp()
                      FOR UPDATE SKIP LOCKED))
      AND NOT EXISTS (SELECT 1 FROM fencelock.lease_waiters AS w
                      WHERE w.name = lease_name AND w.holder <> lease_holder
                        AND w.granted_token = 0::bigint AND w.expires_at > pg_catalog.clock_timestamp()
                        AND w.seq < coalesce((SELECT m.seq FROM fencelock.lease_waiters AS m
                                              WHERE m.name = lease_name AND m.holder = lease_holder
                                                AND m.granted_token = 0::bigint AND m.expires_at > pg_catalog.clock_timestamp()),
                                             9223372036854775807::bigint))
    ON CONFLICT (name) DO UPDATE
        SET name = excluded.name, holder = excluded.holder, token = fencelock.next_token(false),
            acquired_at = greatest(excluded.acquired_at, l.expires_at),
            expires_at = greatest(excluded.acquired_at, l.expires_at) + (excluded.expires_at - excluded.acquired_at)
        WHERE l.expires_at <= pg_catalog.clock_timestamp()
    RETURNING l.token INTO v_token;
    RETURN v_token;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.grant_all (TryAcquireAll, AcquireAll): as in migration 00010, and each member
-- starts at the later of now() and the end of the grant it replaces, as LeaseGrant's.
CREATE OR REPLACE FUNCTION fencelock.grant_all(names text[], who text, ttl_us bigint)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, remaining_us bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    sorted text[];
    soonest timestamptz;
    locked integer;
BEGIN
    sorted := ARRAY(SELECT DISTINCT x COLLATE "C" FROM pg_catalog.unnest(names) AS u(x) ORDER BY 1);
    SELECT pg_catalog.min(l.expires_at) INTO soonest FROM fencelock.leases AS l
    WHERE l.name = ANY (sorted) AND l.expires_at > pg_catalog.clock_timestamp();
    IF soonest IS NOT NULL OR EXISTS (
        SELECT 1 FROM fencelock.lease_waiters AS w
        WHERE w.name = ANY (sorted) AND w.holder <> who AND w.granted_token = 0::bigint
          AND w.expires_at > pg_catalog.clock_timestamp()) THEN
        RETURN QUERY SELECT NULL::text, 0::bigint, NULL::timestamptz,
            CASE WHEN soonest IS NULL THEN 0::bigint
                 ELSE greatest(0::bigint, (EXTRACT(epoch FROM soonest - pg_catalog.clock_timestamp()) * 1000000::numeric)::bigint) END;
        RETURN;
    END IF;
    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)
    SELECT u.x, who, 0::bigint, pg_catalog.now(), pg_catalog.now() FROM pg_catalog.unnest(sorted) WITH ORDINALITY AS u(x, i)
    ORDER BY u.i
    ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;
    WITH lk AS (
        SELECT l.name FROM fencelock.leases AS l
        WHERE l.name = ANY (sorted) AND l.expires_at <= pg_catalog.clock_timestamp()
        ORDER BY l.name COLLATE "C"
        FOR UPDATE OF l SKIP LOCKED
    )
    SELECT pg_catalog.count(*) INTO locked FROM lk;
    IF locked < pg_catalog.cardinality(sorted) THEN
        RETURN QUERY SELECT NULL::text, 0::bigint, NULL::timestamptz, 0::bigint;
        RETURN;
    END IF;
    -- Each member starts at the later of now() and the end of the grant it replaces (its
    -- expired row's expires_at, read before this UPDATE sets it: every SET reads the old
    -- row), as LeaseGrant's; a placeholder inserted above expired at now().
    RETURN QUERY
    UPDATE fencelock.leases AS l
    SET holder = who, token = fencelock.next_token(false),
        acquired_at = greatest(pg_catalog.now(), l.expires_at),
        expires_at = greatest(pg_catalog.now(), l.expires_at) + ttl_us::double precision * interval '1 microsecond'
    WHERE l.name = ANY (sorted)
    RETURNING l.name, l.token, l.expires_at, 0::bigint;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The SQL functions that were one expression, which the planner inlined into their callers,
-- in PL/pgSQL: a function with a SET clause is never inlined, and a SQL function that is not
-- is parsed and planned again at each call (fencelock.timeline() went from 1.6 to 12.0 us of
-- server time), where PL/pgSQL keeps its plans for the session. Same results.
CREATE OR REPLACE FUNCTION fencelock.timeline() RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
BEGIN
    RETURN ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_creation_key(sem text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
BEGIN
    RETURN pg_catalog.hashtextextended('fencelock.semaphores ' || sem, 0);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_row_key(sem text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
BEGIN
    RETURN pg_catalog.hashtextextended('fencelock.semaphores ' || sem, 1);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.semaphore_slots(sem text, n integer) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, fencelock, pg_temp
AS $$
BEGIN
    RETURN ARRAY(SELECT sem || '#' || i FROM pg_catalog.generate_series(0, n - 1) AS i);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Every function of schema fencelock, those of earlier migrations included, runs with the
-- search_path pinned (see 1. above).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'fencelock'::pg_catalog.regnamespace::pg_catalog.oid
             ORDER BY p.oid LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, fencelock, pg_temp', f);
    END LOOP;
END
$$;
-- +goose StatementEnd
