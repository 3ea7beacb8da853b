-- +goose Up
-- The SQL API (issue 29): fencing, lease guards and the minimal lease life cycle as functions
-- of schema fencelock, for a worker in any language and an operator in psql, and a trigger a
-- user attaches to a table of their own so that the database refuses a stale write whoever
-- sends it. docs/SQL.md is the reference; what it lists is part of the API (CHANGELOG.md).
--
-- SQLSTATEs (FL001-FL003 are next_token's, migrations 00002 and 00003):
--   FL004  stale fencing token: a newer token has been seen by the fence or the row
--          (fencelock.ErrStaleToken)
--   FL005  lease lost: the grant (name, holder, token) is no longer current on the database
--          clock: expired, released or taken over (fencelock.ErrLeaseLost)
--   FL006  no fencing token: a write to a protected table carried none (fencelock.ErrNoToken)
--   FL007  invalid argument: refused before anything was read or written
--          (fencelock.ErrInvalidArgument)
--
-- Tokens come from fencelock.next_token, as the Go lessor's do: one sequence, under the
-- epochs, durable when the grant commits; a lease taken here and one taken by a Go lessor
-- exclude each other on the same name, and either's fenced writes refuse the other's stale
-- ones. The functions run with the caller's privileges (SECURITY INVOKER) and are EXECUTE to
-- PUBLIC: the runtime role of README's "Least privilege" may call them all.
--
-- Why plpgsql: a function's statements are planned once per session and their plans cached,
-- as the Go lessor's prepared statements are; a SQL-language function with writes is planned
-- again at every call.

-- +goose StatementBegin
-- The checks below raise FL007 with a message naming the bad argument; the API's functions
-- call them only once a check of their own (one expression: a call per row would cost more
-- than the check) found an argument bad.
-- fencelock.check_text raises FL007 unless val is 1 to 1024 bytes (text cannot hold NUL, and
-- the server's encoding checks the bytes): the limits the Go API checks before any SQL.
CREATE FUNCTION fencelock.check_text(arg text, val text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF val IS NULL OR pg_catalog.octet_length(val) NOT BETWEEN 1 AND 1024 THEN
        RAISE EXCEPTION 'fencelock: % must be 1 to 1024 bytes, got %', arg,
            coalesce(pg_catalog.octet_length(val)::text || ' bytes', 'NULL')
            USING ERRCODE = 'FL007';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.check_token raises FL007 unless token is > 0 (every token ever granted is).
CREATE FUNCTION fencelock.check_token(token bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF token IS NULL OR token <= 0 THEN
        RAISE EXCEPTION 'fencelock: fencing token must be > 0, got %', coalesce(token::text, 'NULL')
            USING ERRCODE = 'FL007';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.ttl_us returns ttl in microseconds, or raises FL007 unless it is between 10 ms
-- and 7 days (fencelock.MinTTL and MaxTTL).
CREATE FUNCTION fencelock.ttl_us(ttl interval) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
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
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.try_acquire grants the lease lease_name to lease_holder for ttl (on the database
-- clock) when it is free, and returns the grant's fencing token; NULL when someone holds it or
-- waits for it in its queue (it does not barge: Go's Lessor.TryAcquire). The TTL counts from
-- the start of its statement (statement_timestamp(), not the transaction's start), so the
-- holder's trust window, counted from when it sent the call, ends before the lease does. Call
-- it in a transaction of its own (autocommit): inside a transaction block the grant is seen
-- by others only once the block commits, and a grant of a new name holds its row against every
-- other grant of that name (they wait on its insert) until then. The statement is the
-- Go lessor's LeaseGrant (sqlc/queries/leases.sql) as a try grant: see its comment for why it is
-- safe. Durable when the caller's transaction commits (next_token raises synchronous_commit
-- from off to on). Raises FL007 for a bad argument; FL001-FL003 from next_token; 25006 on a hot
-- standby.
CREATE FUNCTION fencelock.try_acquire(lease_name text, lease_holder text, ttl interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ttl_us bigint;
    v_token bigint;
BEGIN
    IF (pg_catalog.octet_length(lease_name) BETWEEN 1 AND 1024 AND pg_catalog.octet_length(lease_holder) BETWEEN 1 AND 1024
        AND EXTRACT(epoch FROM ttl) BETWEEN 0.01 AND 604800) IS NOT TRUE THEN
        PERFORM fencelock.check_text('lease_name', lease_name), fencelock.check_text('lease_holder', lease_holder),
                fencelock.ttl_us(ttl);
    END IF;
    v_ttl_us := (EXTRACT(epoch FROM ttl) * 1000000)::bigint;
    INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)
    SELECT lease_name, lease_holder,
           CASE WHEN EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = lease_name)
                THEN 0 ELSE fencelock.next_token(false) END,
           pg_catalog.statement_timestamp(), pg_catalog.statement_timestamp() + v_ttl_us * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur
                      WHERE cur.name = lease_name AND cur.expires_at > pg_catalog.clock_timestamp())
      AND (NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = lease_name)
           OR EXISTS (SELECT 1 FROM fencelock.leases AS cur
                      WHERE cur.name = lease_name AND cur.expires_at <= pg_catalog.clock_timestamp()
                      FOR UPDATE SKIP LOCKED))
      AND NOT EXISTS (SELECT 1 FROM fencelock.lease_waiters AS w
                      WHERE w.name = lease_name AND w.holder <> lease_holder
                        AND w.granted_token = 0 AND w.expires_at > pg_catalog.clock_timestamp()
                        AND w.seq < coalesce((SELECT m.seq FROM fencelock.lease_waiters AS m
                                              WHERE m.name = lease_name AND m.holder = lease_holder
                                                AND m.granted_token = 0 AND m.expires_at > pg_catalog.clock_timestamp()),
                                             9223372036854775807))
    ON CONFLICT (name) DO UPDATE
        SET name = excluded.name, holder = excluded.holder, token = fencelock.next_token(false),
            acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
        WHERE l.expires_at <= pg_catalog.clock_timestamp()
    RETURNING l.token INTO v_token;
    RETURN v_token;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.renew extends the grant (lease_name, lease_holder, lease_token) to the statement's
-- start + ttl (statement_timestamp(), not the transaction's start: a renewal inside a longer
-- transaction is counted from when it was sent) and returns its new expiry; the expiry never
-- moves back. Raises FL005 when the grant is no longer
-- current (expired, released, taken over: a late renewal never revives a lapsed lease), FL007
-- for a bad argument. Raises synchronous_commit from off to on: a renewal lost in a crash would
-- let a new holder in while the old one still trusts its renewal.
CREATE FUNCTION fencelock.renew(lease_name text, lease_holder text, lease_token bigint, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
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
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.release ends the grant (lease_name, lease_holder, lease_token) now and, when
-- someone waits for the name, hands it to the head of the queue (fencelock.hand_off, as the Go
-- lessor's LeaseRelease does). Returns false when the grant had already expired or been taken
-- over (nothing changed). Unlike the Go lessor's own release it does not lower
-- synchronous_commit: it may share a transaction with a fenced write.
CREATE FUNCTION fencelock.release(lease_name text, lease_holder text, lease_token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
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
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.guard_lease checks, inside the caller's transaction, that the grant (lease_name,
-- lease_holder, lease_token) is still current and unexpired on the database clock, and holds
-- the lease row FOR KEY SHARE until the transaction ends, so no takeover commits before it (Go's
-- Lease.GuardTx; the holder's renewals go on). Returns the grant's expiry. Raises FL005 when
-- the grant is gone, FL007 for a bad argument. Use READ COMMITTED, as for GuardTx.
CREATE FUNCTION fencelock.guard_lease(lease_name text, lease_holder text, lease_token bigint) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
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
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.fence advances the high-water mark of resource to token inside the caller's
-- transaction (Go's FenceTx: the same statement as FenceAdvance), and returns token. Equal
-- tokens pass. The fence row stays locked until the transaction ends, so fenced writes to one
-- resource commit in token order. Raises synchronous_commit from off to on. Raises FL004 when
-- resource has seen a larger token (the message and DETAIL give it: "current=N"), FL007 for a
-- bad argument.
CREATE FUNCTION fencelock.fence(resource text, token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_current bigint;
BEGIN
    IF (pg_catalog.octet_length(fence.resource) BETWEEN 1 AND 1024 AND fence.token > 0) IS NOT TRUE THEN
        PERFORM fencelock.check_text('resource', fence.resource), fencelock.check_token(fence.token);
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    INSERT INTO fencelock.fences AS f (resource, token)
    VALUES (fence.resource, fence.token)
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE SET token = excluded.token
    WHERE f.token <= excluded.token
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
-- fencelock.fence_lease is guard_lease and fence in one call (Go's Lease.FenceTx): the grant
-- must be current (else FL005), then resource's high-water mark advances to lease_token (else
-- FL004). Returns lease_token.
CREATE FUNCTION fencelock.fence_lease(lease_name text, lease_holder text, lease_token bigint, resource text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM fencelock.guard_lease(lease_name, lease_holder, lease_token);
    RETURN fencelock.fence(resource, lease_token);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.set_token sets the caller's fencing token for the rest of its transaction (the
-- transaction-local setting fencelock.token, as SET LOCAL would), which the trigger of a
-- protected table checks every row written against. Returns token. Raises FL007 unless
-- token > 0. Outside a transaction block it lasts for the one statement that calls it.
CREATE FUNCTION fencelock.set_token(token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM fencelock.check_token(token);
    PERFORM pg_catalog.set_config('fencelock.token', token::text, true);
    RETURN token;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.refuse_stale_writes is the trigger function that fencelock.protect_table attaches
-- (BEFORE INSERT OR UPDATE OR DELETE, FOR EACH ROW); TG_ARGV[0] is the token column (bigint),
-- TG_ARGV[1] a fence resource or ''. For each row written, the writer's token is
--   1. the transaction-local setting fencelock.token (fencelock.set_token, or SET LOCAL), if set;
--   2. else, for an INSERT, the token column's new value; for an UPDATE, the new value when the
--      UPDATE changed the column;
--   3. else none: the write is refused with FL006. (A DELETE carries its token only by 1.)
-- An UPDATE or DELETE of a row whose token column holds a larger token is refused with FL004;
-- equal tokens pass. INSERT and UPDATE store the writer's token in the column, so the row
-- remembers the newest token that wrote it. With a resource, every write also advances that
-- fence (fencelock.fence: FL004 when the fence has seen a larger token), which fences INSERTs
-- of new rows too. Raises synchronous_commit from off to on: an acknowledged write lost in a
-- crash would take the row's token back with it.
CREATE FUNCTION fencelock.refuse_stale_writes() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
-- Lean on purpose: it runs for every row written, and each statement and expression of a
-- plpgsql function costs its setup again in every transaction (no PERFORM of the check_*
-- helpers, no exception block: each would cost a call or a subtransaction per row).
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
        RAISE EXCEPTION 'fencelock: stale fencing token % for table %.%: the row carries token %',
            v_token, TG_TABLE_SCHEMA, TG_TABLE_NAME, v_old
            USING ERRCODE = 'FL004', DETAIL = pg_catalog.format('current=%s', v_old);
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
-- fencelock.protect_table attaches fencelock.refuse_stale_writes to tbl as the trigger
-- fencelock_refuse_stale_writes (replacing one attached before): every INSERT, UPDATE and
-- DELETE of a row of tbl must then carry a fencing token no older than the one the row carries
-- in token_column (a bigint column of tbl), and, with resource, no older than that fence's
-- high-water mark. Needs what CREATE TRIGGER needs (owning tbl, or TRIGGER on it). Raises
-- FL007 when token_column is not a bigint column of tbl, or resource is not 1 to 1024 bytes.
-- TRUNCATE, and writes while session_replication_role is replica, fire no row trigger.
CREATE FUNCTION fencelock.protect_table(tbl regclass, token_column name DEFAULT 'fence_token', resource text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute AS a
                   WHERE a.attrelid = tbl AND a.attname = token_column AND a.attnum > 0
                     AND NOT a.attisdropped AND a.atttypid = 'pg_catalog.int8'::pg_catalog.regtype) THEN
        RAISE EXCEPTION 'fencelock: % has no bigint column %', tbl, pg_catalog.quote_ident(token_column)
            USING ERRCODE = 'FL007';
    END IF;
    IF resource IS NOT NULL THEN
        PERFORM fencelock.check_text('resource', resource);
    END IF;
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS fencelock_refuse_stale_writes ON %s', tbl);
    EXECUTE pg_catalog.format('CREATE TRIGGER fencelock_refuse_stale_writes BEFORE INSERT OR UPDATE OR DELETE ON %s '
                              'FOR EACH ROW EXECUTE FUNCTION fencelock.refuse_stale_writes(%L, %L)',
                              tbl, token_column, coalesce(resource, ''));
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- fencelock.unprotect_table removes the trigger protect_table attached to tbl, if any.
CREATE FUNCTION fencelock.unprotect_table(tbl regclass) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS fencelock_refuse_stale_writes ON %s', tbl);
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencelock.unprotect_table(regclass);
DROP FUNCTION fencelock.protect_table(regclass, name, text);
DROP FUNCTION fencelock.refuse_stale_writes() CASCADE;
DROP FUNCTION fencelock.set_token(bigint);
DROP FUNCTION fencelock.fence_lease(text, text, bigint, text);
DROP FUNCTION fencelock.fence(text, bigint);
DROP FUNCTION fencelock.guard_lease(text, text, bigint);
DROP FUNCTION fencelock.release(text, text, bigint);
DROP FUNCTION fencelock.renew(text, text, bigint, interval);
DROP FUNCTION fencelock.try_acquire(text, text, interval);
DROP FUNCTION fencelock.ttl_us(interval);
DROP FUNCTION fencelock.check_token(bigint);
DROP FUNCTION fencelock.check_text(text, text);
