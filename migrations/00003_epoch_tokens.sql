-- +goose Up
-- Epoch tokens: every token carries an epoch, the server's timeline, in its high bits, so a
-- token drawn after a promotion is larger than every token the old primary issued, whatever
-- WAL the promotion lost.
--
-- Why: with asynchronous replication a standby promoted after its primary died may not have
-- replayed the last sequence increments; its nextval then hands out values the old primary
-- already gave to holders, and a holder paused across the failover carries a token larger than
-- the new holder's. A promotion always starts a new timeline, numbered above every timeline
-- the promoted server knows of (from the history files in its pg_wal and in the WAL archive);
-- the timeline is in the name of the WAL segment being written (pg_walfile_name of the insert
-- position: pg_control_checkpoint() keeps the old timeline until the first checkpoint after
-- promotion).
--
-- Layout of a token (an int64 > 0):
--   bits 62..47  epoch: timeline + fencelock.token_epoch.epoch_offset, 1 .. 65535 (tokens
--                issued before this migration have 0)
--   bits 46..0   sequence: nextval('fencelock.leases_token_seq'), 1 .. 2^47 - 1
-- Budget: 2^47 - 1 (about 1.4e14) grants over the database's life (the sequence is never
-- reset: 44 years at 100,000 grants a second) and epochs up to 65535 (each promotion or
-- point-in-time recovery starts a timeline). Past either, next_token refuses with SQLSTATE
-- FL002 (fencelock.ErrTokenBudget) and issues nothing, rather than a token that could go
-- backwards.
--
-- Tokens issued after this migration are larger than every token issued before it: those are
-- sequence values below 2^47 (checked here, under a lock that waits for every transaction that
-- drew a token and holds off new ones until this migration commits) with epoch 0, while every
-- new token has an epoch of at least 1.
--
-- What keeps the timeline's order: a standby promoted (when it knows every earlier timeline:
-- a standby that never saw a newer timeline's history file, with no shared archive, picks
-- that timeline's number again), a point-in-time recovery. What does not: pg_upgrade (it
-- starts the new cluster on timeline 1), a logical copy (pg_dump and restore, logical
-- replication) into another cluster; nor does a base backup restored without recovery, which
-- keeps its timeline with an older sequence (nothing here can see that). The highest epoch
-- issued is kept in fencelock.token_epoch.last_epoch: where the epoch is now below it,
-- next_token refuses with SQLSTATE FL003 (fencelock.ErrTokenEpochBehind) instead of issuing a
-- smaller token; fencelock.rebase_token_epoch() then raises epoch_offset above every epoch the
-- database has seen (and its argument, for tokens kept only elsewhere).

-- Wait for every transaction that drew a token (each wrote fencelock.leases or
-- fencelock.token_flushes) and hold off new ones until this migration commits: a transaction
-- open across it would keep running the cached old next_token.
LOCK TABLE fencelock.leases, fencelock.token_flushes IN SHARE MODE;

-- +goose StatementBegin
DO $$
DECLARE
    last bigint;
BEGIN
    SELECT s.last_value INTO last FROM fencelock.leases_token_seq AS s;
    IF last >= 140737488355328 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL002',
            MESSAGE = format('fencelock: token sequence is at %s, past the 2^47 - 1 that epoch tokens leave for the sequence', last),
            HINT = 'epoch tokens cannot be larger than every token issued so far; see fencelock migration 00003';
    END IF;
END
$$;
-- +goose StatementEnd

-- One row. epoch_offset is raised only by rebase_token_epoch; last_epoch, the highest epoch
-- this database has issued tokens in, by next_token.
CREATE TABLE fencelock.token_epoch (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    epoch_offset integer NOT NULL DEFAULT 0 CHECK (epoch_offset >= 0),
    last_epoch   integer NOT NULL DEFAULT 0 CHECK (last_epoch >= 0)
);
INSERT INTO fencelock.token_epoch DEFAULT VALUES;

-- Roles that draw tokens read the row and record last_epoch: every role that may insert into
-- fencelock.leases or fencelock.token_flushes (the roles that take leases or advisory tokens)
-- gets those privileges here, so that an existing least-privilege role keeps working.
-- +goose StatementBegin
DO $$
DECLARE
    r regrole;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
        WHERE c.oid IN ('fencelock.leases'::regclass, 'fencelock.token_flushes'::regclass)
          AND a.privilege_type = 'INSERT' AND a.grantee <> 0
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, UPDATE (last_epoch) ON fencelock.token_epoch TO %s', r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
               WHERE c.oid IN ('fencelock.leases'::regclass, 'fencelock.token_flushes'::regclass)
                 AND a.privilege_type = 'INSERT' AND a.grantee = 0) THEN
        GRANT SELECT, UPDATE (last_epoch) ON fencelock.token_epoch TO PUBLIC;
    END IF;
END
$$;
-- +goose StatementEnd

-- fencelock.timeline() is the timeline the server writes WAL on: the first 8 hex digits of the
-- name of the segment at the insert position. It fails on a hot standby.
-- +goose StatementBegin
CREATE FUNCTION fencelock.timeline() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
SELECT ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint
$$;
-- +goose StatementEnd

-- fencelock.rebase_token_epoch(at_least) raises fencelock.token_epoch.epoch_offset so that the
-- epoch of the next token is at least at_least, above last_epoch and above the epoch of every
-- token in fencelock.leases, fencelock.fences and fencelock.token_flushes; it never lowers the
-- offset. It returns the epoch of the next token. Call it after pg_upgrade or a logical copy
-- (see above), before any grant there, and let the standbys replay it before a failover.
-- +goose StatementBegin
CREATE FUNCTION fencelock.rebase_token_epoch(at_least integer DEFAULT 0) RETURNS integer
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

-- +goose Down
-- Drops fencelock.token_epoch: a rebased epoch_offset is lost, and migrating up again starts
-- from 0.
DROP FUNCTION fencelock.rebase_token_epoch(integer);
DROP FUNCTION fencelock.timeline();
DROP TABLE fencelock.token_epoch;
-- Back to plain sequence tokens. Tokens drawn after this are smaller than the epoch tokens
-- already issued: every fence and every external system that keeps a high-water mark would
-- reject the new holders. Migrate down only a database whose tokens nobody keeps.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencelock.next_token(durable boolean) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    seq_cache bigint;
    seq_cycle boolean;
    seq_increment bigint;
    t bigint;
BEGIN
    SELECT s.seqcache, s.seqcycle, s.seqincrement INTO seq_cache, seq_cycle, seq_increment
    FROM pg_catalog.pg_sequence AS s
    WHERE s.seqrelid = 'fencelock.leases_token_seq'::regclass;
    IF seq_cache IS DISTINCT FROM 1 OR seq_cycle OR seq_increment <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL001',
            MESSAGE = format('fencelock: token sequence fencelock.leases_token_seq has CACHE %s, INCREMENT %s%s; tokens would not rise in grant order',
                             seq_cache, seq_increment, CASE WHEN seq_cycle THEN ', CYCLE' ELSE '' END),
            HINT = 'ALTER SEQUENCE fencelock.leases_token_seq CACHE 1 INCREMENT 1 NO CYCLE';
    END IF;
    t := pg_catalog.nextval('fencelock.leases_token_seq');
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
