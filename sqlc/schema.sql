-- GENERATED, DO NOT EDIT. fencelock's schema at the head: every table, index, view, sequence,
-- function and trigger of schema fencelock as the last migration of migrations/ leaves it.
-- The migrations are the history (and what fencelock.Migrate applies); this file is the SQL
-- that runs today. sqlc reads it (sqlc/sqlc.yaml). To change the schema, add a migration,
-- then regenerate this file:
--
--   FENCELOCK_UPDATE_SCHEMA=1 go test -count=1 -run TestHeadSchemaIsCurrent github.com/fencelock/fencelock/migrations/
--
-- That applies the migrations with fencelock.Migrate to a fresh database of the test server,
-- runs pg_dump --schema-only --schema=fencelock --exclude-table=fencelock.goose_db_version
-- --no-owner --no-privileges (the pg_dump of the server's binaries) and drops what varies
-- between runs and pg_dump versions (version comments, SET and set_config lines, \restrict
-- keys, runs of blank lines). TestHeadSchemaIsCurrent (in CI) fails when this file differs.

--
-- PostgreSQL database dump
--

--
-- Name: fencelock; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA fencelock;

--
-- Name: check_issued(bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.check_issued(token bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: check_text(text, text); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.check_text(arg text, val text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    IF val IS NULL OR pg_catalog.octet_length(val) NOT BETWEEN 1 AND 1024 THEN
        RAISE EXCEPTION 'fencelock: % must be 1 to 1024 bytes, got %', arg,
            coalesce(pg_catalog.octet_length(val)::text || ' bytes', 'NULL')
            USING ERRCODE = 'FL007';
    END IF;
END
$$;

--
-- Name: check_token(bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.check_token(token bigint) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    IF token IS NULL OR token <= 0 THEN
        RAISE EXCEPTION 'fencelock: fencing token must be > 0, got %', coalesce(token::text, 'NULL')
            USING ERRCODE = 'FL007';
    END IF;
END
$$;

--
-- Name: fence(text, bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.fence(resource text, token bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: fence_lease(text, text, bigint, text); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.fence_lease(lease_name text, lease_holder text, lease_token bigint, resource text) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    PERFORM fencelock.guard_lease(lease_name, lease_holder, lease_token);
    RETURN fencelock.fence(resource, lease_token);
END
$$;

--
-- Name: force_release(text, text[], bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.force_release(lease_name text, fence text[], expected_token bigint DEFAULT NULL::bigint) RETURNS TABLE(old_holder text, old_token bigint, lapsed boolean, new_token bigint, handed_to text, woken text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $_$
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
$_$;

--
-- Name: grant_all(text[], text, bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.grant_all(names text[], who text, ttl_us bigint) RETURNS TABLE(name text, token bigint, expires_at timestamp with time zone, remaining_us bigint)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: grant_to_lease_roles(text, text); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.grant_to_lease_roles(privileges text, objects text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
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
        EXECUTE format('GRANT %s ON %s TO %s', privileges, objects, r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
               WHERE c.oid = 'fencelock.leases'::regclass
                 AND a.privilege_type = 'INSERT' AND a.grantee = 0) THEN
        EXECUTE format('GRANT %s ON %s TO PUBLIC', privileges, objects);
    END IF;
END
$$;

--
-- Name: guard_lease(text, text, bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.guard_lease(lease_name text, lease_holder text, lease_token bigint) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF (pg_catalog.octet_length(lease_name) BETWEEN 1 AND 1024 AND pg_catalog.octet_length(lease_holder) BETWEEN 1 AND 1024
        AND lease_token > 0) IS NOT TRUE THEN
        PERFORM fencelock.check_text('lease_name', lease_name), fencelock.check_text('lease_holder', lease_holder),
                fencelock.check_token(lease_token);
    END IF;
    SELECT l.expires_at INTO v_expires
    FROM fencelock.leases AS l
    WHERE l.name = lease_name AND l.holder = lease_holder AND l.token = lease_token
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR KEY SHARE;
    IF v_expires IS NULL THEN
        RAISE EXCEPTION 'fencelock: lease % (token %) lost: the database no longer has this grant (expired or taken over)',
            pg_catalog.quote_literal(lease_name), lease_token
            USING ERRCODE = 'FL005';
    END IF;
    RETURN v_expires;
END
$$;

--
-- Name: hand_off(text, text, bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.hand_off(lease_name text, from_holder text, from_token bigint) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    h record;
    tok bigint;
    exp timestamptz;
    woke boolean;
BEGIN
    -- The grant, locked FOR UPDATE as a grant needs it; skipped when someone else holds a lock
    -- on the row: a guarded transaction of the holder (FOR KEY SHARE), or the holder's
    -- renewal in flight.
    PERFORM 1 FROM fencelock.leases AS l
    WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        -- The head, locked. Its row may be deleted (the head gave up) while this waits for
        -- its lock: look again, a few times, while anyone live waits.
        FOR i IN 1..3 LOOP
            SELECT w.holder, w.wait_id, w.channel, w.ttl_us INTO h
            FROM fencelock.lease_waiters AS w
            WHERE w.name = lease_name AND w.holder <> from_holder AND w.granted_token = 0
              AND w.expires_at > pg_catalog.clock_timestamp()
            ORDER BY w.seq
            LIMIT 1
            FOR UPDATE;
            EXIT WHEN FOUND OR NOT EXISTS (
                SELECT 1 FROM fencelock.lease_waiters AS q
                WHERE q.name = lease_name AND q.holder <> from_holder AND q.granted_token = 0
                  AND q.expires_at > pg_catalog.clock_timestamp());
        END LOOP;
        -- A head that waits for a TTL grant takes it here; one that waits to run a
        -- transaction-scoped grant (ttl_us 0) is woken below to take the free lease itself.
        IF h.holder IS NOT NULL AND h.ttl_us > 0 THEN
            tok := fencelock.next_token(false);
            UPDATE fencelock.lease_waiters AS w
            SET granted_token = tok, granted_expires_at = pg_catalog.clock_timestamp() + h.ttl_us * interval '1 microsecond',
                expires_at = pg_catalog.clock_timestamp()
            WHERE w.name = lease_name AND w.holder = h.holder
            RETURNING w.granted_expires_at INTO exp;
            UPDATE fencelock.leases AS l
            SET holder = h.holder, token = tok, acquired_at = pg_catalog.clock_timestamp(), expires_at = exp
            WHERE l.name = lease_name
            RETURNING CASE WHEN h.channel IS NULL THEN false ELSE
                pg_catalog.pg_notify(h.channel, pg_catalog.concat_ws(' ', h.wait_id, tok,
                    (EXTRACT(epoch FROM exp) * 1000000)::bigint,
                    pg_catalog.octet_length(h.holder), h.holder || lease_name)) IS NOT NULL END INTO woke;
            RETURN CASE WHEN woke THEN 3 ELSE 2 END;
        END IF;
    ELSE
        -- Locked by someone else: release without a hand-off (below) once the renewal in
        -- flight, if any, has committed (FOR NO KEY UPDATE does not wait for FOR KEY SHARE).
        PERFORM 1 FROM fencelock.leases AS l
        WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token
          AND l.expires_at > pg_catalog.clock_timestamp()
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN 0;
        END IF;
    END IF;
    UPDATE fencelock.leases AS l
    SET expires_at = pg_catalog.clock_timestamp()
    WHERE l.name = lease_name AND l.holder = from_holder AND l.token = from_token;
    -- Wake the head, without a grant, to try for itself.
    PERFORM pg_catalog.pg_notify(q.channel, pg_catalog.concat_ws(' ', q.wait_id, 0, 0,
                pg_catalog.octet_length(q.holder), q.holder || lease_name))
    FROM (SELECT w.holder, w.wait_id, w.channel FROM fencelock.lease_waiters AS w
          WHERE w.name = lease_name AND w.holder <> from_holder AND w.granted_token = 0
            AND w.expires_at > pg_catalog.clock_timestamp()
          ORDER BY w.seq LIMIT 1) AS q
    WHERE q.channel IS NOT NULL;
    RETURN 1;
END
$$;

--
-- Name: inheritance_tree(regclass); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.inheritance_tree(tbl regclass) RETURNS TABLE(rel regclass, depth integer)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: issued_bound(); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.issued_bound() RETURNS bigint
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: next_token(boolean); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.next_token(durable boolean) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    seq_cache bigint;
    seq_cycle boolean;
    seq_increment bigint;
    s bigint;
    off bigint;
    last bigint;
    marked bigint;
    recorded bigint;
    epoch bigint;
    t bigint;
BEGIN
    SELECT q.seqcache, q.seqcycle, q.seqincrement INTO seq_cache, seq_cycle, seq_increment
    FROM pg_catalog.pg_sequence AS q
    WHERE q.seqrelid = 'fencelock.leases_token_seq'::regclass;
    IF seq_cache IS DISTINCT FROM 1 OR seq_cycle OR seq_increment <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL001',
            MESSAGE = format('fencelock: token sequence fencelock.leases_token_seq has CACHE %s, INCREMENT %s%s; tokens would not rise in grant order',
                             seq_cache, seq_increment, CASE WHEN seq_cycle THEN ', CYCLE' ELSE '' END),
            HINT = 'ALTER SEQUENCE fencelock.leases_token_seq CACHE 1 INCREMENT 1 NO CYCLE';
    END IF;
    -- nextval first: on a hot standby it fails with SQLSTATE 25006 (fencelock.ErrReadOnly),
    -- where pg_current_wal_insert_lsn would fail with a less telling error.
    s := pg_catalog.nextval('fencelock.leases_token_seq');
    IF s >= 140737488355328 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL002',
            MESSAGE = format('fencelock: token budget exhausted: sequence value %s is past 2^47 - 1', s),
            HINT = 'see fencelock migration 00003 for the layout of a token';
    END IF;
    -- One statement reads the row and the highest mark (one row even where the row is
    -- missing, as after a copy that left it out).
    SELECT e.epoch_offset, e.last_epoch, k.top INTO off, last, marked
    FROM (SELECT max(m.epoch) AS top FROM fencelock.token_epoch_marks AS m) AS k
    LEFT JOIN fencelock.token_epoch AS e ON e.id;
    epoch := fencelock.timeline() + coalesce(off, 0);
    recorded := greatest(coalesce(last, 0), coalesce(marked, 0));
    IF epoch < recorded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL003',
            MESSAGE = format('fencelock: token epoch %s is below epoch %s, the highest this database has issued tokens in: the timeline went back (pg_upgrade, a logical copy)', epoch, recorded),
            HINT = 'SELECT fencelock.rebase_token_epoch() (fencelock.RebaseTokenEpoch) raises the epoch above every earlier one';
    END IF;
    IF epoch > 65535 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL002',
            MESSAGE = format('fencelock: token budget exhausted: epoch %s (timeline plus fencelock.token_epoch.epoch_offset) is past the 65535 that epoch tokens allow', epoch),
            HINT = 'see fencelock migration 00003 for the layout of a token';
    END IF;
    IF epoch > coalesce(last, 0) OR marked IS NOT NULL THEN
        -- A new epoch, or marks to fold: taken by whichever token can lock the row. Rare (around
        -- a promotion or a rebase), so the subtransaction of the block costs the common path
        -- nothing.
        BEGIN
            -- SKIP LOCKED: never wait for the row's holder, which may be a transaction that
            -- stays open for as long as its caller likes. In READ COMMITTED, FOR UPDATE returns
            -- the row as last committed, so last is then current.
            SELECT e.last_epoch INTO last FROM fencelock.token_epoch AS e WHERE e.id FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                -- The row's holder records the epoch in it, and folds the marks that last_epoch
                -- now covers (committed ones: a mark still being inserted is not seen, and
                -- stays). Only the row's holder deletes marks, so no delete waits for another.
                IF epoch > last THEN
                    UPDATE fencelock.token_epoch AS e SET last_epoch = epoch WHERE e.id;
                    last := epoch;
                END IF;
                DELETE FROM fencelock.token_epoch_marks AS m WHERE m.epoch <= last;
            END IF;
        EXCEPTION WHEN serialization_failure THEN
            -- REPEATABLE READ or SERIALIZABLE: the row, or a mark this transaction saw, was
            -- changed by a transaction that committed after its snapshot (a record or a fold of
            -- the same moment). The block's writes are undone; the mark below records the epoch
            -- instead, and the grant goes on rather than fail for the record's sake.
            last := NULL;
        END;
        IF last IS NULL AND epoch > recorded THEN
            -- Another transaction holds the row and may roll back (or the row is missing): record
            -- the epoch in a row of this transaction's own, which commits with this token (no
            -- unique key: never waits).
            INSERT INTO fencelock.token_epoch_marks (epoch) VALUES (epoch);
        END IF;
    END IF;
    t := (epoch << 47) | s;
    -- With synchronous_commit = off (a server, role or session default), the commit would not
    -- wait for its flush. Any other setting waits for at least the local flush: kept as it is.
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF durable THEN
        INSERT INTO fencelock.token_flushes AS f (pid, token) VALUES (pg_catalog.pg_backend_pid(), t)
        ON CONFLICT (pid) DO UPDATE SET token = excluded.token;
    END IF;
    RETURN t;
END
$$;

--
-- Name: protect_table(regclass, name, text); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.protect_table(tbl regclass, token_column name DEFAULT 'fence_token'::name, resource text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: rebase_token_epoch(integer); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.rebase_token_epoch(at_least integer DEFAULT 0) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    top bigint;
    tli bigint;
    off bigint;
    last bigint;
    marked bigint;
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = '25006',
            MESSAGE = 'fencelock: rebase_token_epoch on a hot standby: run it on the primary';
    END IF;
    tli := fencelock.timeline();
    SELECT greatest(
        (SELECT max(l.token) FROM fencelock.leases AS l),
        (SELECT max(f.token) FROM fencelock.fences AS f),
        (SELECT max(k.token) FROM fencelock.token_flushes AS k)) INTO top;
    SELECT e.epoch_offset, e.last_epoch INTO off, last FROM fencelock.token_epoch AS e FOR UPDATE;
    -- Read after the row's lock: a mark committed since is counted too. One committed later
    -- carries an epoch drawn with the offset before this one, which this never lowers.
    SELECT max(m.epoch) INTO marked FROM fencelock.token_epoch_marks AS m;
    off := greatest(coalesce(off, 0), coalesce(top >> 47, 0) + 1 - tli, coalesce(last, 0) + 1 - tli,
                    coalesce(marked, 0) + 1 - tli, at_least - tli);
    IF tli + off > 65535 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL002',
            MESSAGE = format('fencelock: token budget exhausted: epoch %s is past the 65535 that epoch tokens allow', tli + off);
    END IF;
    INSERT INTO fencelock.token_epoch AS e (id, epoch_offset) VALUES (true, off)
    ON CONFLICT (id) DO UPDATE SET epoch_offset = excluded.epoch_offset;
    RETURN tli + off;
END
$$;

--
-- Name: refuse_stale_writes(); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.refuse_stale_writes() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $_$
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
$_$;

--
-- Name: release(text, text, bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.release(lease_name text, lease_holder text, lease_token bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    v_released boolean;
BEGIN
    IF (pg_catalog.octet_length(lease_name) BETWEEN 1 AND 1024 AND pg_catalog.octet_length(lease_holder) BETWEEN 1 AND 1024
        AND lease_token > 0) IS NOT TRUE THEN
        PERFORM fencelock.check_text('lease_name', lease_name), fencelock.check_text('lease_holder', lease_holder),
                fencelock.check_token(lease_token);
    END IF;
    UPDATE fencelock.leases AS l
    SET expires_at = pg_catalog.clock_timestamp()
    WHERE l.name = lease_name AND l.holder = lease_holder AND l.token = lease_token
      AND l.expires_at > pg_catalog.clock_timestamp()
      AND NOT EXISTS (SELECT 1 FROM fencelock.lease_waiters AS w
                      WHERE w.name = lease_name AND w.holder <> lease_holder
                        AND w.granted_token = 0 AND w.expires_at > pg_catalog.clock_timestamp())
    RETURNING true INTO v_released;
    IF v_released THEN
        RETURN true;
    END IF;
    RETURN fencelock.hand_off(lease_name, lease_holder, lease_token) > 0;
END
$$;

--
-- Name: renew(text, text, bigint, interval); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.renew(lease_name text, lease_holder text, lease_token bigint, ttl interval) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    v_ttl_us bigint;
    v_expires timestamptz;
BEGIN
    IF (pg_catalog.octet_length(lease_name) BETWEEN 1 AND 1024 AND pg_catalog.octet_length(lease_holder) BETWEEN 1 AND 1024
        AND lease_token > 0 AND EXTRACT(epoch FROM ttl) BETWEEN 0.01 AND 604800) IS NOT TRUE THEN
        PERFORM fencelock.check_text('lease_name', lease_name), fencelock.check_text('lease_holder', lease_holder),
                fencelock.check_token(lease_token), fencelock.ttl_us(ttl);
    END IF;
    v_ttl_us := (EXTRACT(epoch FROM ttl) * 1000000)::bigint;
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    UPDATE fencelock.leases AS l
    SET expires_at = greatest(l.expires_at, pg_catalog.statement_timestamp() + v_ttl_us * interval '1 microsecond'),
        renewals = CASE WHEN l.renewed_token = l.token THEN l.renewals + 1 ELSE 1 END,
        renewed_token = l.token, renewed_at = pg_catalog.statement_timestamp()
    WHERE l.name = lease_name AND l.holder = lease_holder AND l.token = lease_token
      AND l.expires_at > pg_catalog.clock_timestamp()
    RETURNING l.expires_at INTO v_expires;
    IF v_expires IS NULL THEN
        RAISE EXCEPTION 'fencelock: lease % (token %) lost: the database no longer has this grant (expired or taken over)',
            pg_catalog.quote_literal(lease_name), lease_token
            USING ERRCODE = 'FL005';
    END IF;
    RETURN v_expires;
END
$$;

--
-- Name: semaphore_acquire(text, text, bigint, bigint, integer, boolean, text, bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_acquire(sem text, who text, wait bigint, ttl_us bigint, default_limit integer, queue boolean, chan text, live_us bigint) RETURNS TABLE(outcome integer, name text, token bigint, expires_at timestamp with time zone, server_now timestamp with time zone, ahead bigint, remaining_us bigint, permit_limit integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: semaphore_creation_key(text); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_creation_key(sem text) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    RETURN pg_catalog.hashtextextended('fencelock.semaphores ' || sem, 0);
END
$$;

--
-- Name: semaphore_dispatch(text, integer); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_dispatch(sem text, lim integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: semaphore_give(text, integer); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_give(sem text, slot integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: semaphore_leave(text, bigint, text); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_leave(sem text, wait bigint, who text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: semaphore_reclaim(text, integer, integer, timestamp with time zone); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_reclaim(sem text, lim integer, n integer, t timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: semaphore_release(text, text, text, bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_release(sem text, slot text, who text, tok bigint) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: semaphore_row_key(text); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_row_key(sem text) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    RETURN pg_catalog.hashtextextended('fencelock.semaphores ' || sem, 1);
END
$$;

--
-- Name: semaphore_set_limit(text, integer); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_set_limit(sem text, n integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: semaphore_slots(text, integer); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_slots(sem text, n integer) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    RETURN ARRAY(SELECT sem || '#' || i FROM pg_catalog.generate_series(0, n - 1) AS i);
END
$$;

--
-- Name: semaphore_wake(text, bigint, timestamp with time zone); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.semaphore_wake(sem text, k bigint, at timestamp with time zone) RETURNS integer
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
    SELECT count(pg_catalog.pg_notify(q.channel, pg_catalog.concat_ws(' ', q.wait_id, 0, 0,
               pg_catalog.octet_length(q.holder), q.holder || sem)))::integer
    FROM (SELECT w.channel, w.wait_id, w.holder FROM fencelock.semaphore_waiters AS w
          WHERE w.semaphore = sem AND w.expires_at > at
          ORDER BY w.seq LIMIT greatest(k, 0)) AS q
    WHERE q.channel IS NOT NULL;
$$;

--
-- Name: set_token(bigint); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.set_token(token bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    PERFORM fencelock.check_token(token), fencelock.check_issued(token);
    PERFORM pg_catalog.set_config('fencelock.token', token::text, true);
    RETURN token;
END
$$;

--
-- Name: timeline(); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.timeline() RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
BEGIN
    RETURN ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint;
END
$$;

--
-- Name: try_acquire(text, text, interval); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.try_acquire(lease_name text, lease_holder text, ttl interval) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
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

--
-- Name: ttl_us(interval); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.ttl_us(ttl interval) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    s numeric := EXTRACT(epoch FROM ttl);
BEGIN
    IF s IS NULL OR s NOT BETWEEN 0.01 AND 604800 THEN
        RAISE EXCEPTION 'fencelock: ttl must be between 10 ms and 7 days, got %', coalesce(ttl::text, 'NULL')
            USING ERRCODE = 'FL007';
    END IF;
    RETURN (s * 1000000)::bigint;
END
$$;

--
-- Name: unprotect_table(regclass); Type: FUNCTION; Schema: fencelock; Owner: -
--

CREATE FUNCTION fencelock.unprotect_table(tbl regclass) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'fencelock', 'pg_temp'
    AS $$
DECLARE
    r regclass;
BEGIN
    FOR r IN SELECT t.rel FROM fencelock.inheritance_tree(tbl) AS t LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS fencelock_refuse_stale_writes ON %s', r);
    END LOOP;
END
$$;

--
-- Name: advisory_locks; Type: VIEW; Schema: fencelock; Owner: -
--

CREATE VIEW fencelock.advisory_locks AS
 SELECT
        CASE
            WHEN (k.objsubid = 1) THEN (((k.classid)::bigint << 32) | (k.objid)::bigint)
            ELSE NULL::bigint
        END AS key,
        CASE
            WHEN (k.objsubid = 2) THEN (k.classid)::integer
            ELSE NULL::integer
        END AS key1,
        CASE
            WHEN (k.objsubid = 2) THEN (k.objid)::integer
            ELSE NULL::integer
        END AS key2,
        CASE
            WHEN ((a.application_name ~~ 'fencelock %'::text) AND (a.application_name !~~ 'fencelock key %'::text)) THEN substr(a.application_name, 11)
            ELSE NULL::text
        END AS name,
        CASE k.mode
            WHEN 'ExclusiveLock'::text THEN 'exclusive'::text
            ELSE 'shared'::text
        END AS mode,
    k.granted,
    k.pid,
    a.application_name,
    a.client_addr,
    a.backend_start,
    a.xact_start,
    a.state,
    a.state_change,
    k.waitstart,
        CASE
            WHEN (NOT k.granted) THEN pg_blocking_pids(k.pid)
            ELSE NULL::integer[]
        END AS blocked_by
   FROM (pg_locks k
     LEFT JOIN pg_stat_activity a ON ((a.pid = k.pid)))
  WHERE ((k.locktype = 'advisory'::text) AND (k.database = ( SELECT d.oid
           FROM pg_database d
          WHERE (d.datname = current_database()))));

--
-- Name: election_values; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.election_values (
    name text NOT NULL,
    token bigint NOT NULL,
    value text NOT NULL,
    proclaimed_at timestamp with time zone NOT NULL,
    CONSTRAINT election_values_name_length CHECK (((octet_length(name) >= 1) AND (octet_length(name) <= 1024))),
    CONSTRAINT election_values_value_length CHECK ((octet_length(value) <= 4096))
)
WITH (fillfactor='70');

--
-- Name: fences; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.fences (
    resource text NOT NULL COLLATE pg_catalog."C",
    token bigint NOT NULL
)
WITH (fillfactor='70');

--
-- Name: lease_waiters; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.lease_waiters (
    name text NOT NULL,
    holder text NOT NULL,
    wait_id bigint NOT NULL,
    seq bigint NOT NULL,
    channel text,
    ttl_us bigint NOT NULL,
    since timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    granted_token bigint DEFAULT 0 NOT NULL,
    granted_expires_at timestamp with time zone
)
WITH (fillfactor='70');

--
-- Name: lease_queue; Type: VIEW; Schema: fencelock; Owner: -
--

CREATE VIEW fencelock.lease_queue AS
 SELECT w.name,
    w.holder,
    row_number() OVER (PARTITION BY w.name ORDER BY w.seq) AS "position",
    w.since,
    (clock_timestamp() - w.since) AS waited,
    (w.channel IS NOT NULL) AS woken_by_notify
   FROM fencelock.lease_waiters w
  WHERE ((w.granted_token = 0) AND (w.expires_at > clock_timestamp()));

--
-- Name: lease_queue_summary; Type: VIEW; Schema: fencelock; Owner: -
--

CREATE VIEW fencelock.lease_queue_summary AS
 SELECT q.name,
    count(*) AS waiters,
    (array_agg(q.holder ORDER BY q."position"))[1] AS head_holder,
    max(q.waited) AS head_waited
   FROM fencelock.lease_queue q
  GROUP BY q.name;

--
-- Name: leases; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.leases (
    name text NOT NULL,
    holder text NOT NULL,
    token bigint NOT NULL,
    acquired_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    renewals bigint DEFAULT 0 NOT NULL,
    renewed_token bigint DEFAULT 0 NOT NULL,
    renewed_at timestamp with time zone,
    permit_wait bigint
)
WITH (fillfactor='70');

--
-- Name: holders; Type: VIEW; Schema: fencelock; Owner: -
--

CREATE VIEW fencelock.holders AS
 SELECT l.name,
    l.holder,
    l.token,
    l.acquired_at,
    (clock_timestamp() - l.acquired_at) AS held_for,
    l.expires_at,
    (l.expires_at - clock_timestamp()) AS ttl_left,
    (l.expires_at - COALESCE(
        CASE
            WHEN (l.renewed_token = l.token) THEN l.renewed_at
            ELSE NULL::timestamp with time zone
        END, l.acquired_at)) AS ttl,
        CASE
            WHEN (l.renewed_token = l.token) THEN l.renewals
            ELSE (0)::bigint
        END AS renewals,
        CASE
            WHEN (l.renewed_token = l.token) THEN l.renewed_at
            ELSE NULL::timestamp with time zone
        END AS last_renewal,
        CASE
            WHEN ((clock_timestamp() - COALESCE(
            CASE
                WHEN (l.renewed_token = l.token) THEN l.renewed_at
                ELSE NULL::timestamp with time zone
            END, l.acquired_at)) < ((l.expires_at - COALESCE(
            CASE
                WHEN (l.renewed_token = l.token) THEN l.renewed_at
                ELSE NULL::timestamp with time zone
            END, l.acquired_at)) / (2)::double precision)) THEN 'ok'::text
            ELSE 'late'::text
        END AS heartbeat,
    COALESCE(q.waiters, (0)::bigint) AS waiters,
    q.head_holder AS next_holder
   FROM (fencelock.leases l
     LEFT JOIN fencelock.lease_queue_summary q ON ((q.name = l.name)))
  WHERE ((l.token > 0) AND (l.expires_at > clock_timestamp()));

--
-- Name: job_runs; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.job_runs (
    job text NOT NULL,
    slot timestamp with time zone NOT NULL,
    holder text NOT NULL,
    token bigint NOT NULL,
    attempt integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    succeeded boolean,
    error text,
    CONSTRAINT job_runs_job_length CHECK (((octet_length(job) >= 1) AND (octet_length(job) <= 1024)))
)
WITH (fillfactor='70');

--
-- Name: job_ledger; Type: VIEW; Schema: fencelock; Owner: -
--

CREATE VIEW fencelock.job_ledger AS
 SELECT r.job,
    r.slot,
    r.holder,
    r.token,
    r.attempt,
    r.started_at,
    r.finished_at,
        CASE
            WHEN (r.token = 0) THEN 'missed'::text
            WHEN ((r.finished_at IS NOT NULL) AND r.succeeded) THEN 'succeeded'::text
            WHEN (r.finished_at IS NOT NULL) THEN 'failed'::text
            WHEN (EXISTS ( SELECT 1
               FROM fencelock.leases l
              WHERE ((l.name = r.job) AND (l.token = r.token) AND (l.expires_at > clock_timestamp())))) THEN 'running'::text
            ELSE 'crashed'::text
        END AS outcome,
    r.error
   FROM fencelock.job_runs r;

--
-- Name: leaders; Type: VIEW; Schema: fencelock; Owner: -
--

CREATE VIEW fencelock.leaders AS
 SELECT l.name,
    l.holder,
    l.token,
        CASE
            WHEN (v.token = l.token) THEN v.value
            ELSE NULL::text
        END AS value,
    l.acquired_at AS elected_at,
    l.expires_at
   FROM (fencelock.election_values v
     JOIN fencelock.leases l ON ((l.name = v.name)))
  WHERE ((l.token > 0) AND (l.expires_at > clock_timestamp()));

--
-- Name: lease_waiters_seq; Type: SEQUENCE; Schema: fencelock; Owner: -
--

CREATE SEQUENCE fencelock.lease_waiters_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: leases_token_seq; Type: SEQUENCE; Schema: fencelock; Owner: -
--

CREATE SEQUENCE fencelock.leases_token_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: leases_token_seq; Type: SEQUENCE OWNED BY; Schema: fencelock; Owner: -
--

ALTER SEQUENCE fencelock.leases_token_seq OWNED BY fencelock.leases.token;

--
-- Name: rate_limits; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.rate_limits (
    key text NOT NULL,
    tat timestamp with time zone NOT NULL,
    allowed boolean NOT NULL,
    decided_at timestamp with time zone NOT NULL
)
WITH (fillfactor='70');

--
-- Name: semaphore_free; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.semaphore_free (
    semaphore text NOT NULL,
    slot integer NOT NULL
);

--
-- Name: semaphore_waiters; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.semaphore_waiters (
    semaphore text NOT NULL,
    wait_id bigint NOT NULL,
    holder text NOT NULL,
    seq bigint NOT NULL,
    channel text,
    since timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    ttl_us bigint DEFAULT 0 NOT NULL
)
WITH (fillfactor='70');

--
-- Name: semaphores; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.semaphores (
    name text NOT NULL,
    permit_limit integer NOT NULL,
    slots integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    next_reclaim timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    CONSTRAINT semaphores_permit_limit_check CHECK ((permit_limit > 0)),
    CONSTRAINT semaphores_slots_check CHECK ((slots >= 0))
);

--
-- Name: semaphore_state; Type: VIEW; Schema: fencelock; Owner: -
--

CREATE VIEW fencelock.semaphore_state AS
 SELECT s.name,
    s.permit_limit,
    ( SELECT count(*) AS count
           FROM fencelock.leases l
          WHERE ((l.name = ANY (fencelock.semaphore_slots(s.name, GREATEST(s.permit_limit, s.slots)))) AND (l.expires_at > clock_timestamp()))) AS held,
    ( SELECT count(*) AS count
           FROM fencelock.semaphore_waiters w
          WHERE ((w.semaphore = s.name) AND (w.expires_at > clock_timestamp()))) AS waiting
   FROM fencelock.semaphores s;

--
-- Name: semaphore_waiters_seq; Type: SEQUENCE; Schema: fencelock; Owner: -
--

CREATE SEQUENCE fencelock.semaphore_waiters_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: token_epoch; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.token_epoch (
    id boolean DEFAULT true NOT NULL,
    epoch_offset integer DEFAULT 0 NOT NULL,
    last_epoch integer DEFAULT 0 NOT NULL,
    CONSTRAINT token_epoch_epoch_offset_check CHECK ((epoch_offset >= 0)),
    CONSTRAINT token_epoch_id_check CHECK (id),
    CONSTRAINT token_epoch_last_epoch_check CHECK ((last_epoch >= 0))
);

--
-- Name: token_epoch_marks; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.token_epoch_marks (
    epoch integer NOT NULL,
    CONSTRAINT token_epoch_marks_epoch_check CHECK ((epoch > 0))
);

ALTER TABLE ONLY fencelock.token_epoch_marks REPLICA IDENTITY FULL;

--
-- Name: token_flushes; Type: TABLE; Schema: fencelock; Owner: -
--

CREATE TABLE fencelock.token_flushes (
    pid integer NOT NULL,
    token bigint NOT NULL
)
WITH (fillfactor='50');

--
-- Name: leases token; Type: DEFAULT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.leases ALTER COLUMN token SET DEFAULT nextval('fencelock.leases_token_seq'::regclass);

--
-- Name: election_values election_values_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.election_values
    ADD CONSTRAINT election_values_pkey PRIMARY KEY (name);

--
-- Name: fences fences_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.fences
    ADD CONSTRAINT fences_pkey PRIMARY KEY (resource);

--
-- Name: job_runs job_runs_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.job_runs
    ADD CONSTRAINT job_runs_pkey PRIMARY KEY (job, slot);

--
-- Name: lease_waiters lease_waiters_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.lease_waiters
    ADD CONSTRAINT lease_waiters_pkey PRIMARY KEY (name, holder);

--
-- Name: leases leases_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (name);

--
-- Name: rate_limits rate_limits_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.rate_limits
    ADD CONSTRAINT rate_limits_pkey PRIMARY KEY (key);

--
-- Name: semaphore_free semaphore_free_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.semaphore_free
    ADD CONSTRAINT semaphore_free_pkey PRIMARY KEY (semaphore, slot);

--
-- Name: semaphore_waiters semaphore_waiters_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.semaphore_waiters
    ADD CONSTRAINT semaphore_waiters_pkey PRIMARY KEY (semaphore, wait_id);

--
-- Name: semaphores semaphores_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.semaphores
    ADD CONSTRAINT semaphores_pkey PRIMARY KEY (name);

--
-- Name: token_epoch token_epoch_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.token_epoch
    ADD CONSTRAINT token_epoch_pkey PRIMARY KEY (id);

--
-- Name: token_flushes token_flushes_pkey; Type: CONSTRAINT; Schema: fencelock; Owner: -
--

ALTER TABLE ONLY fencelock.token_flushes
    ADD CONSTRAINT token_flushes_pkey PRIMARY KEY (pid);

--
-- Name: lease_waiters_queue; Type: INDEX; Schema: fencelock; Owner: -
--

CREATE INDEX lease_waiters_queue ON fencelock.lease_waiters USING btree (name, seq);

--
-- Name: leases_permit_wait; Type: INDEX; Schema: fencelock; Owner: -
--

CREATE INDEX leases_permit_wait ON fencelock.leases USING btree (permit_wait) WHERE (permit_wait IS NOT NULL);

--
-- Name: semaphore_waiters_queue; Type: INDEX; Schema: fencelock; Owner: -
--

CREATE INDEX semaphore_waiters_queue ON fencelock.semaphore_waiters USING btree (semaphore, seq);

--
-- PostgreSQL database dump complete
--
