-- +goose Up
-- Every fencing token is drawn by fencelock.next_token, which makes it durable when the
-- transaction that drew it commits (for a lease grant or a session lock, the statement itself),
-- whatever earlier transactions did.
--
-- Why a function: nextval WAL-logs 32 values ahead and writes no WAL for a value inside an
-- already logged range. When the transaction that logged the range rolled back (a RunLocked
-- whose fn failed, a refused grant), that WAL was never flushed; a later transaction that
-- draws a value of the range and writes nothing else commits without a flush (a commit flushes
-- only when the transaction has an xid and wrote WAL of its own), and a crash then hands the
-- same value out again. A grant that writes its lease row has an xid and WAL of its own, so
-- its synchronous commit flushes the WAL up to its commit record, the logged range included.
-- An advisory grant writes nothing, so next_token(true) writes one row of its own: the row of
-- this backend in fencelock.token_flushes (rows of other backends are never touched, so no
-- two transactions contend for one). Roles that take advisory tokens need INSERT and UPDATE
-- on it; fencelock.SweepLeases deletes the rows of exited backends. Assigning an xid alone (pg_current_xact_id()) is not
-- enough: the commit of a transaction with an xid but no WAL of its own is not flushed.
CREATE TABLE fencelock.token_flushes (
    pid   integer PRIMARY KEY,
    token bigint  NOT NULL
) WITH (fillfactor = 50);

-- next_token refuses a token sequence that cannot keep tokens in grant order: with CACHE > 1
-- each backend hands out its own block (tokens of one name can go backwards); with CYCLE the
-- sequence wraps; with a negative INCREMENT it counts down. SQLSTATE FL001, mapped to fencelock.ErrTokenSequence by the Go package.
-- +goose StatementBegin
CREATE FUNCTION fencelock.next_token(durable boolean) RETURNS bigint
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
DROP FUNCTION fencelock.next_token(boolean);
DROP TABLE fencelock.token_flushes;
