-- +goose Up
-- Epoch tokens: every token carries the server's timeline in its high bits, so a token drawn
-- after a promotion is larger than every token the old primary issued, whatever WAL the
-- promotion lost.
--
-- Why: with asynchronous replication a standby promoted after its primary died may not have
-- replayed the last sequence increments; its nextval then hands out values the old primary
-- already gave to holders, and a holder paused across the failover carries a token larger than
-- the new holder's. A promotion always starts a new timeline, numbered higher than every
-- timeline the promoted server knows of; the timeline is in the name of the WAL segment being
-- written (pg_walfile_name of the insert position: pg_control_checkpoint() keeps the old
-- timeline until the first checkpoint after promotion).
--
-- Layout of a token (an int64 > 0):
--   bits 62..47  epoch: the timeline, 1 .. 65535 (tokens issued before this migration have 0)
--   bits 46..0   sequence: nextval('fencelock.leases_token_seq'), 1 .. 2^47 - 1
-- Budget: 2^47 - 1 (about 1.4e14) grants over the database's life (the sequence is never
-- reset: 44 years at 100,000 grants a second) and timelines up to 65535 (each promotion or
-- point-in-time recovery starts one). Past either, next_token refuses with SQLSTATE FL002
-- (fencelock.ErrTokenBudget) and issues nothing, rather than a token that could go backwards.
--
-- Tokens issued after this migration are larger than every token issued before it: those are
-- sequence values below 2^47 (checked here) with epoch 0, while every new token has an epoch
-- of at least 1.
--
-- The epoch is the timeline plus fencelock.token_epoch.epoch_offset (0 until changed). Physical
-- copies keep the timeline's order: a standby, a point-in-time recovery, pg_upgrade (which
-- carries the old cluster's timeline over). A logical copy does not: pg_dump and restore, or
-- logical replication, into another cluster starts at that cluster's timeline, often 1. After
-- one, call fencelock.rebase_token_epoch(), which raises the offset so that the next epoch is
-- above every epoch found in fencelock's tables (and above its argument, for tokens kept only
-- elsewhere), before any grant on the copy.

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

CREATE TABLE fencelock.token_epoch (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    epoch_offset integer NOT NULL DEFAULT 0 CHECK (epoch_offset >= 0)
);
INSERT INTO fencelock.token_epoch DEFAULT VALUES;

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
-- epoch of the next token is at least at_least and above the epoch of every token in
-- fencelock.leases, fencelock.fences and fencelock.token_flushes; it never lowers the offset.
-- It returns the epoch of the next token. Call it on a logical copy (see above) before any
-- grant there.
-- +goose StatementBegin
CREATE FUNCTION fencelock.rebase_token_epoch(at_least integer DEFAULT 0) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    top bigint;
    tli bigint := fencelock.timeline();
    off bigint;
BEGIN
    SELECT greatest(
        (SELECT max(l.token) FROM fencelock.leases AS l),
        (SELECT max(f.token) FROM fencelock.fences AS f),
        (SELECT max(k.token) FROM fencelock.token_flushes AS k)) INTO top;
    SELECT e.epoch_offset INTO off FROM fencelock.token_epoch AS e FOR UPDATE;
    off := greatest(coalesce(off, 0), coalesce(top >> 47, 0) + 1 - tli, at_least - tli);
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
    epoch := fencelock.timeline() + coalesce((SELECT e.epoch_offset FROM fencelock.token_epoch AS e), 0);
    IF epoch < 1 OR epoch > 65535 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FL002',
            MESSAGE = format('fencelock: token budget exhausted: epoch %s (timeline plus fencelock.token_epoch.epoch_offset) is past the 65535 that epoch tokens allow', epoch),
            HINT = 'see fencelock migration 00003 for the layout of a token';
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
