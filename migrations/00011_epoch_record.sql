-- +goose Up
-- The highest epoch that issued a token is recorded durably, whatever transaction drew the
-- epoch's first token and however it ended (issue 21, defect 2).
--
-- Why: since migration 00003, the first token of a new epoch records it in
-- fencelock.token_epoch.last_epoch, by an UPDATE of the one row that skips the row when another
-- transaction holds it (SKIP LOCKED), so that no grant waits for a transaction that can stay
-- open as long as its caller likes (a RunLocked holds the row from its grant to its commit).
-- The holder records the same epoch, but only if it commits: after a promotion, a RunLocked
-- drew the new epoch's first token and locked the row, a TryAcquire drew a token of that epoch,
-- skipped the record and committed, and the RunLocked rolled back. last_epoch kept the old
-- epoch, and a copy of the database onto a server on the old timeline (pg_upgrade, pg_dump and
-- restore) granted tokens below the TryAcquire's instead of refusing (FL003).
--
-- Now a token whose epoch its transaction finds unrecorded, and that cannot lock the row,
-- records the epoch in fencelock.token_epoch_marks, a table of its own rows inserted by its
-- own transaction: whichever transactions commit a token of epoch E commit a record of E with
-- them (last_epoch, or a mark), and a transaction that rolls back takes only its own tokens'
-- records with it. The recorded epoch is the greatest of last_epoch and every mark; next_token
-- refuses an epoch below it (FL003), and rebase_token_epoch raises the epoch above it.
--
-- Why no insert ever waits: the table has no unique key (nothing to check against rows that
-- other transactions are inserting) and no row is ever updated. Marks are folded into
-- last_epoch by a token that locks the row (SKIP LOCKED, never waiting): it raises last_epoch
-- to its epoch (at least every mark it can see: a mark above its epoch would have refused it)
-- and deletes the marks at or below last_epoch, in its own transaction, so a rollback undoes
-- both and a commit keeps the record; only the row's holder deletes, so no delete waits for
-- another either. Marks appear only around a new epoch (a promotion, a rebase), while another
-- transaction holds the row; the table is empty otherwise. It holds at most one mark per
-- transaction that drew a token of an unrecorded epoch before the first mark of that epoch
-- committed, until the next fold: a few rows. So no index: every token reads the highest mark
-- by a scan of an empty table (the planner picks it over an index on a table this small, and
-- an index would take one more of a transaction's 16 fast-path lock slots), which costs a
-- token about 4 us (docs/FAILOVER.md).
--
-- REPLICA IDENTITY FULL: with no key, a publication that publishes deletes (FOR ALL TABLES)
-- would make the fold's DELETE fail; FULL logs the deleted row (one integer) instead.
CREATE TABLE fencelock.token_epoch_marks (
    epoch integer NOT NULL CHECK (epoch > 0)
);
ALTER TABLE fencelock.token_epoch_marks REPLICA IDENTITY FULL;

-- Wait for every transaction that drew a token (each wrote fencelock.leases or
-- fencelock.token_flushes) and hold off new ones until this migration commits, as migration
-- 00003 does: a transaction open across it could keep running the old next_token (a session
-- reads the new definition only once it takes a new lock), which skips the record.
LOCK TABLE fencelock.leases, fencelock.token_flushes IN SHARE MODE;

-- Every role that draws tokens reads fencelock.token_epoch: each of them (and PUBLIC, where
-- PUBLIC may read it) may read, add and fold marks, so that an existing least-privilege role
-- keeps working.
-- +goose StatementBegin
DO $$
DECLARE
    r regrole;
    owner oid;
BEGIN
    SELECT c.relowner INTO owner FROM pg_catalog.pg_class AS c WHERE c.oid = 'fencelock.token_epoch'::regclass;
    FOR r IN
        SELECT g.grantee::regrole FROM (
            SELECT a.grantee
            FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
            WHERE c.oid = 'fencelock.token_epoch'::regclass AND a.privilege_type = 'SELECT'
            UNION
            SELECT a.grantee
            FROM pg_catalog.pg_attribute AS t, LATERAL pg_catalog.aclexplode(t.attacl) AS a
            WHERE t.attrelid = 'fencelock.token_epoch'::regclass AND a.privilege_type = 'SELECT'
        ) AS g
        WHERE g.grantee <> 0 AND g.grantee <> owner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, DELETE ON fencelock.token_epoch_marks TO %s', r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
               WHERE c.oid = 'fencelock.token_epoch'::regclass AND a.privilege_type = 'SELECT' AND a.grantee = 0)
       OR EXISTS (SELECT FROM pg_catalog.pg_attribute AS t, LATERAL pg_catalog.aclexplode(t.attacl) AS a
                  WHERE t.attrelid = 'fencelock.token_epoch'::regclass AND a.privilege_type = 'SELECT' AND a.grantee = 0) THEN
        GRANT SELECT, INSERT, DELETE ON fencelock.token_epoch_marks TO PUBLIC;
    END IF;
END
$$;
-- +goose StatementEnd

-- fencelock.rebase_token_epoch as in migration 00003, and above every mark too.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.rebase_token_epoch(at_least integer DEFAULT 0) RETURNS integer
LANGUAGE plpgsql VOLATILE
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
-- +goose StatementEnd

-- fencelock.next_token as in migration 00003, but for the record of the epoch (above).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.next_token(durable boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
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
-- +goose StatementEnd

-- +goose Down
-- Back to migration 00003's record: the marks are folded into last_epoch first, so the
-- database still refuses an epoch below every epoch recorded so far. The same lock as Up: no
-- token transaction is open across the change.
LOCK TABLE fencelock.leases, fencelock.token_flushes IN SHARE MODE;
UPDATE fencelock.token_epoch AS e
SET last_epoch = greatest(e.last_epoch, (SELECT max(m.epoch) FROM fencelock.token_epoch_marks AS m))
WHERE EXISTS (SELECT FROM fencelock.token_epoch_marks);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.rebase_token_epoch(at_least integer DEFAULT 0) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    top bigint;
    tli bigint;
    off bigint;
    last bigint;
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
    off := greatest(coalesce(off, 0), coalesce(top >> 47, 0) + 1 - tli, coalesce(last, 0) + 1 - tli, at_least - tli);
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
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.next_token(durable boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    seq_cache bigint;
    seq_cycle boolean;
    seq_increment bigint;
    s bigint;
    off bigint;
    last bigint;
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
    SELECT e.epoch_offset, e.last_epoch INTO off, last FROM fencelock.token_epoch AS e;
    epoch := fencelock.timeline() + coalesce(off, 0);
    IF epoch < coalesce(last, 0) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL003',
            MESSAGE = format('fencelock: token epoch %s is below epoch %s, the highest this database has issued tokens in: the timeline went back (pg_upgrade, a logical copy)', epoch, last),
            HINT = 'SELECT fencelock.rebase_token_epoch() (fencelock.RebaseTokenEpoch) raises the epoch above every earlier one';
    END IF;
    IF epoch > 65535 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL002',
            MESSAGE = format('fencelock: token budget exhausted: epoch %s (timeline plus fencelock.token_epoch.epoch_offset) is past the 65535 that epoch tokens allow', epoch),
            HINT = 'see fencelock migration 00003 for the layout of a token';
    END IF;
    IF epoch > coalesce(last, 0) THEN
        -- The first token of a new epoch records it, once. SKIP LOCKED: a transaction that
        -- holds the row (a RunLocked of the same moment) records the same epoch; should it
        -- roll back, a later token records it.
        UPDATE fencelock.token_epoch AS e SET last_epoch = epoch
        WHERE e.id AND e.last_epoch < epoch
          AND e.id IN (SELECT k.id FROM fencelock.token_epoch AS k FOR UPDATE SKIP LOCKED);
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
-- +goose StatementEnd

DROP TABLE fencelock.token_epoch_marks;
