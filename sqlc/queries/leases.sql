-- name: LeaseGrant :one
-- Grants the lease named @name to @holder when its row is absent or expired on the database
-- clock, in one statement; returns no row when someone else holds it.
--
-- Why it is safe:
--  * ON CONFLICT DO UPDATE locks the existing row before it evaluates the WHERE, so two grants
--    of one name are serialised by the row lock and the second sees the first's expires_at.
--    It sets name (to itself), a key column, so that lock is FOR UPDATE, not FOR NO KEY UPDATE:
--    it conflicts with the FOR KEY SHARE that LeaseGuard and LeaseFence hold, so no takeover
--    commits before a guarded transaction of the previous holder, while renewals and releases
--    (FOR NO KEY UPDATE, a non-key update) do not wait for it. (The value does not change, so
--    the update stays HOT.)
--  * The token is drawn by fencelock.next_token under that row lock, after every earlier grant
--    of the name committed, so tokens for a name rise strictly in grant order (and never
--    repeat: one sequence serves all names). The INSERT path draws one too, but only when it
--    may insert: a refused grant burns it, so tokens are increasing but not consecutive.
--  * One token per grant of an existing name (issue 23: a token costs about 10 us of server
--    CPU, a fifth of the statement). With @nowait, a row that the statement's snapshot shows
--    can never be inserted over: the grant goes on only if its FOR UPDATE SKIP LOCKED
--    subquery below locked that row (expired, current version), so no sweep can delete it
--    before the INSERT, which then always conflicts and takes the DO UPDATE, which draws the
--    grant's token under the row lock. The INSERT path's value is then a placeholder 0
--    (never written: ON CONFLICT discards it; the caller still refuses a token that is not
--    positive). Without @nowait (RunLocked) the row may be gone by the INSERT (a sweep), and
--    the INSERT path draws a real token as before.
--  * The token is durable when the grant commits, even when it falls in a range WAL-logged by
--    a transaction that rolled back: a grant writes its lease row, so its transaction has an
--    xid and WAL of its own, and next_token raises synchronous_commit from off to on, so the commit flushes
--    the WAL up to its own record, the sequence's logged range included. (This is the reason
--    next_token(false) suffices here; see migrations/00002_durable_tokens.sql.)
--  * The token is drawn inline on the common path (issue 31: next_token's PL/pgSQL call and
--    its two queries cost the grant about 19 us of its 52 us of server time): when the epoch
--    this server draws in (its timeline plus epoch_offset) is the one token_epoch records,
--    no mark waits to be folded, the sequence is CACHE 1, INCREMENT > 0, NO CYCLE, and the
--    statement has run for less than 5 ms, the token is (epoch << 47) | nextval, exactly what
--    next_token(false) returns then, with synchronous_commit raised from off to on as it
--    does. A drawn value past the 2^47 budget calls next_token(false), whose own draw is past
--    it too and raises FL002 (checking the drawn value, not the last one, holds for any
--    INCREMENT). Anything else (a new epoch to record, marks, a sequence altered, the epoch
--    row missing or behind, a statement that ran 5 ms or more) calls next_token(false), which
--    reads token_epoch in a snapshot of its own and records, folds or raises FL001-FL003 as
--    before. Why the 5 ms: the inline check reads token_epoch in the statement's snapshot,
--    taken when the statement started, while next_token's read is fresh. A statement that
--    waited (for the row lock, a relation lock) could otherwise draw a token of the epoch
--    before a rebase that committed during its wait, after the rebase returned.
--    RebaseTokenEpoch returns no sooner than 10 ms after its commit, so every draw that starts
--    after it returns either began after the commit (its snapshot has the new epoch) or runs
--    the fresh path. Inside RunLocked's REPEATABLE READ or SERIALIZABLE transaction the
--    snapshot is the transaction's, as next_token's read is: no change there. And the DO UPDATE
--    path calls next_token when the locked row's token has a higher epoch than the one read:
--    tokens of a name rise whatever the snapshot.
--  * @ttl_us is the TTL in microseconds; 0 (transaction-scoped grants) makes the row expire at
--    transaction start, so it is free again as soon as the holding transaction ends.
--  * A grant starts no earlier than the end of the grant it replaces: acquired_at is the later
--    of now() (the statement's start) and the expired row's expires_at, and expires_at is that
--    plus the TTL. A statement that started just before the old grant's expiry and found it
--    passed by its check would otherwise date the new grant up to its own run time before the
--    old one ended (TestReleaseLostInCrashExpiresByTTL saw 0.4 ms once). The holder's trust
--    window, counted from its own send time, only ends further before the expiry.
--  * A NOT EXISTS pre-check (the snapshot's view) refuses a lease that is plainly held without
--    reaching ON CONFLICT, which locks the existing row even when its WHERE then fails. Without
--    it every refused grant would row-lock the holder's row, and the holder's renewals, which
--    skip locked rows, would skip it while others poll, until its trust window ran out. The
--    pre-check decides nothing: the WHERE of ON CONFLICT, under the row lock, does. It only
--    keeps refused grants off rows that are held.
--  * With @nowait (try grants, and each attempt of a waiting Acquire), a grant never waits for
--    a row another transaction holds (a transaction-scoped holder, a concurrent grant of the
--    name, a sweep deleting it): an expired row is locked FOR UPDATE SKIP LOCKED first, and a
--    row that is locked refuses the grant at once. Only an expired row is locked there, so a
--    held row is never locked by anyone else's grant. (A lock_timeout would bound the wait
--    too, but it also fires on the relation extension lock that concurrent inserts of new
--    names queue for, and refused free names under load.) What is left are races inside the
--    statement's own run: a row absent from its snapshot but committed before its insert
--    (ON CONFLICT then waits for that row's lock: a concurrent grant's statement, or, if the
--    row was created and locked by a RunLocked in those microseconds, its transaction), and a
--    row deleted by a sweep in between (a waiting RunLocked then inserts it). Without @nowait
--    (RunLocked) the grant queues on the row lock in the server's queue.
--  * While anyone waits in the name's queue (a live row of fencelock.lease_waiters) ahead of
--    this holder (the first in seq order: see LeaseRelease for why not EXISTS), nothing is
--    granted here: the lease goes to the head of the queue
--    (LeaseRelease hands a TTL grant over, or wakes a waiting RunLocked, whose grant this is;
--    the head's own attempt takes it once it expires). Try grants (no row in the queue) never
--    barge past waiters.
--  * Without @may_insert (transaction-scoped grants) the grant never inserts a row: it returns
--    no row when the name has none, and the caller creates the row with LeaseEnsureRow, in a
--    statement of its own, and tries again. A row inserted by a transaction that stays open
--    would make every other grant of the name wait for that whole transaction.
WITH fast AS MATERIALIZED (
    -- The epoch of the inline draw, read once, when a draw first needs it (see above); no row
    -- when the draw must go through next_token. The timeline is fencelock.timeline()'s
    -- expression, written out: that function pins its search_path (migration 00017), which
    -- keeps the planner from inlining it, and a call would cost the grant a SQL function's
    -- parse and plan.
    SELECT e.last_epoch::bigint AS epoch FROM fencelock.token_epoch AS e, pg_catalog.pg_sequence AS q
    WHERE e.id AND e.last_epoch = ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint + e.epoch_offset
      AND e.last_epoch <= 65535
      AND q.seqrelid = 'fencelock.leases_token_seq'::regclass::oid
      AND q.seqcache = 1 AND NOT q.seqcycle AND q.seqincrement > 0
      AND NOT EXISTS (SELECT 1 FROM fencelock.token_epoch_marks)
)
INSERT INTO fencelock.leases AS l (name, holder, token, acquired_at, expires_at)
SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text,
       CASE WHEN sqlc.arg(nowait)::boolean AND EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text)
            THEN 0
            WHEN (SELECT f.epoch FROM fast AS f) IS NULL OR pg_catalog.clock_timestamp() - pg_catalog.statement_timestamp() >= interval '5 milliseconds'
            THEN fencelock.next_token(false)
            WHEN pg_catalog.current_setting('synchronous_commit') = 'off'
                 AND pg_catalog.set_config('synchronous_commit', 'on', true) IS NULL THEN NULL
            ELSE (SELECT CASE WHEN d.s < 140737488355328 THEN (f.epoch << 47) | d.s ELSE fencelock.next_token(false) END
                  FROM fast AS f, (SELECT pg_catalog.nextval('fencelock.leases_token_seq') AS s) AS d) END,
       now(), now() + sqlc.arg(ttl_us)::bigint::float8 * interval '1 microsecond'
WHERE NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur
                  WHERE cur.name = sqlc.arg(name)::text AND cur.expires_at > clock_timestamp())
  AND (NOT sqlc.arg(nowait)::boolean
       OR NOT EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text)
       OR EXISTS (SELECT 1 FROM fencelock.leases AS cur
                  WHERE cur.name = sqlc.arg(name)::text AND cur.expires_at <= clock_timestamp()
                  FOR UPDATE SKIP LOCKED))
  AND (sqlc.arg(may_insert)::boolean
       OR EXISTS (SELECT 1 FROM fencelock.leases AS cur WHERE cur.name = sqlc.arg(name)::text))
  AND (SELECT w.seq FROM fencelock.lease_waiters AS w
       WHERE w.name = sqlc.arg(name)::text AND w.holder <> sqlc.arg(holder)::text
         AND w.granted_token = 0 AND w.expires_at > clock_timestamp()
         AND w.seq < coalesce((SELECT m.seq FROM fencelock.lease_waiters AS m
                               WHERE m.name = sqlc.arg(name)::text AND m.holder = sqlc.arg(holder)::text
                                 AND m.granted_token = 0 AND m.expires_at > clock_timestamp()),
                              9223372036854775807)
       ORDER BY w.seq LIMIT 1) IS NULL
ON CONFLICT (name) DO UPDATE
    SET name = excluded.name, holder = excluded.holder,
        token = CASE WHEN (SELECT f.epoch FROM fast AS f) IS NULL OR (l.token >> 47) > (SELECT f.epoch FROM fast AS f)
                          OR pg_catalog.clock_timestamp() - pg_catalog.statement_timestamp() >= interval '5 milliseconds'
                     THEN fencelock.next_token(false)
                     WHEN pg_catalog.current_setting('synchronous_commit') = 'off'
                          AND pg_catalog.set_config('synchronous_commit', 'on', true) IS NULL THEN NULL
                     ELSE (SELECT CASE WHEN d.s < 140737488355328 THEN (f.epoch << 47) | d.s ELSE fencelock.next_token(false) END
                           FROM fast AS f, (SELECT pg_catalog.nextval('fencelock.leases_token_seq') AS s) AS d) END,
        acquired_at = greatest(excluded.acquired_at, l.expires_at),
        expires_at = greatest(excluded.acquired_at, l.expires_at) + (excluded.expires_at - excluded.acquired_at)
    WHERE l.expires_at <= clock_timestamp()
RETURNING l.token, l.expires_at;

-- name: LeaseEnsureRow :exec
-- Creates an expired placeholder row for @name when it has none, in a statement of its own,
-- for a transaction-scoped grant (RunLocked) that found no row: the grant then locks a
-- committed row instead of inserting one (a nowait grant skips a locked committed row at once,
-- whereas a row inserted by a transaction that is still open would make every other grant of
-- the name wait for the whole transaction). Token 0 and expired on arrival: no renewal,
-- release or guard matches it (each needs its grant's token and an unexpired row); expired
-- now, not in 1970, so the sweep's grace keeps it while the RunLocked that created it tries
-- again. Draws no token, and writes nothing when the row exists.
INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at)
VALUES (sqlc.arg(name)::text, sqlc.arg(holder)::text, 0, now(), now())
ON CONFLICT (name) DO NOTHING;

-- name: LeaseRemaining :one
-- The current grant's remaining TTL on the database clock, in microseconds (0 when expired).
-- Read only after a refused grant, to time the next attempt.
SELECT greatest(0, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000000.0)::bigint)::bigint AS remaining_us
FROM fencelock.leases AS l
WHERE l.name = sqlc.arg(name)::text;

-- name: LeaseRenew :many
-- Extends each of @holder's leases given as parallel arrays (@names, @tokens, @ttls_us in
-- microseconds) to now() + its TTL, in one statement for the whole batch.
--
-- Why it is safe:
--  * Scoped to (name, holder, token) and to rows not yet expired on the database clock, so a
--    late renewal can never revive a lapsed lease or touch a newer grant. The expiry is
--    checked again by the UPDATE, after target's row lock: a row that another transaction
--    only locked (not updated) meanwhile is not rechecked by the lock, and a renewal whose
--    check ran just before the expiry could otherwise extend a lease that expired while it
--    waited (a semaphore grant locks expired permits and counts them free: migration 00008).
--    The recheck mentions target (+ 0 microseconds), so it is a join qual, evaluated when the
--    join pairs a lease row with target's, that is after target locked it, whatever the
--    join order; on leases alone it could run while a hash of leases is built, before the
--    lock.
--  * The expiry never moves back: now() is the transaction's start, so of two renewals of one
--    lease (the heartbeat's and a Lease.Renew) the one that commits last may have started
--    first; greatest() keeps the later expiry, which the holder's trust window (the larger of
--    the two) relies on.
--  * Rows locked by someone else are skipped rather than waited for, so one long transaction
--    cannot hold up the renewal of every other lease in the batch. The holder's own guarded
--    transactions (FOR KEY SHARE) do not conflict with this lock; grants of other holders
--    never lock a held row (see LeaseGrant's pre-check), so neither fenced writes nor polling
--    make a renewal skip. What is left is a row locked by a transaction-scoped holder
--    (RunLocked) of the name, which this holder's lease cannot have.
--  * synchronous_commit is raised from off to on (as everywhere: other settings already wait
--    for the local flush): a renewal lost in a crash would let a new holder in while the old
--    one still trusts its renewal.
--  * It counts the grant's renewals for fencelock.holders (migration 00005): renewed_token
--    tells a count of this grant from one an earlier grant left behind.
--
-- What it returns: a row with renewed = true for each lease renewed, carrying the lease's
-- place in the arrays (idx, from 1), not its name: the caller matches rows to its leases by
-- index, with no string to decode or hash. Only when some lease of the batch was not renewed
-- (the count of renewed rows, read once, falls short), it also returns renewed = false rows
-- for every lease of the batch still current in the statement's snapshot, renewed ones
-- included: the caller keeps true over false. A lease that comes back only with false was
-- skipped as locked (retry it soon); one that does not come back is lost.
-- Cost: linear in the batch, whatever the size of the table: each lease is looked up by its
-- key in a LATERAL subquery, which the planner cannot turn into a join (the row lock of the
-- first, the LIMIT of the second keep it a subquery run per lease), and the UPDATE reads
-- only the batch's names (name = ANY, an index condition) whichever join it picks. As plain
-- joins, the planner chose a hash join over a scan of the whole table once a batch reached a
-- few hundred leases: a lessor of 100,000 leases, renewed in statements of 1,000, scanned the
-- table 100 times a heartbeat (TestRenewalPlanScalesWithBatch). One scalar count; no
-- anti-join over a CTE, which the planner runs as a nested loop, quadratic in the batch.
WITH cfg AS MATERIALIZED (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) AS sync_commit
), v AS MATERIALIZED (
    SELECT pg_catalog.unnest(sqlc.arg(names)::text[]) AS name, pg_catalog.unnest(sqlc.arg(tokens)::bigint[]) AS token,
           pg_catalog.unnest(sqlc.arg(ttls_us)::bigint[]) AS ttl_us,
           pg_catalog.generate_subscripts(sqlc.arg(names)::text[], 1) AS idx -- in step with the unnests
    FROM cfg
), target AS (
    SELECT t.name, v.ttl_us, v.idx
    FROM v CROSS JOIN LATERAL (
        SELECT l.name FROM fencelock.leases AS l
        WHERE l.name = v.name AND l.token = v.token
          AND l.holder = sqlc.arg(holder)::text AND l.expires_at > clock_timestamp()
        FOR NO KEY UPDATE OF l SKIP LOCKED
    ) AS t
), renewed AS (
    UPDATE fencelock.leases AS l
    SET expires_at = greatest(l.expires_at, now() + target.ttl_us::float8 * interval '1 microsecond'),
        renewals = CASE WHEN l.renewed_token = l.token THEN l.renewals + 1 ELSE 1 END,
        renewed_token = l.token, renewed_at = now()
    FROM target
    WHERE l.name = target.name AND l.name = ANY (sqlc.arg(names)::text[])
      AND l.expires_at > clock_timestamp() + target.ttl_us::float8 * interval '0 microseconds'
    RETURNING target.idx, l.expires_at
)
SELECT r.idx::integer AS idx, r.expires_at::timestamptz AS expires_at, true AS renewed
FROM renewed AS r
UNION ALL
SELECT v.idx::integer, c.expires_at, false
FROM v CROSS JOIN LATERAL (
    SELECT l.expires_at FROM fencelock.leases AS l
    WHERE l.name = v.name AND l.token = v.token
      AND l.holder = sqlc.arg(holder)::text AND l.expires_at > clock_timestamp()
    LIMIT 1 -- at most one row (name is the key); the LIMIT keeps the lookup per lease
) AS c
WHERE (SELECT count(*) FROM renewed) < pg_catalog.cardinality(sqlc.arg(names)::text[]);

-- name: LeaseReleaseUnknown :execrows
-- Ends any grant to @holder of a name in @names (one name for a lease, a set's names for
-- TryAcquireAll) except the tokens in @keep_tokens (the lessor's leases it still believes
-- held, or is releasing, and grants handed to its waits that they have not claimed yet) and
-- every grant a release handed to a wait of @holder. Used after a grant statement was abandoned
-- in flight: the server may have granted just as the client gave up, and the token is then
-- unknown to the client.
--
-- Why it is safe:
--  * It ends only what the abandoned statement may have granted. A grant statement (LeaseGrant,
--    LeaseAcquire's granted, fencelock.grant_all) draws a new token, and no queue row records
--    it: a token gets into fencelock.lease_waiters.granted_token only by fencelock.hand_off,
--    which draws it when a release hands the lease to a wait. So a grant of @holder whose token
--    a queue row of @holder records was handed over, never made by the abandoned statement, and
--    is spared: its wait claims it (from the NOTIFY, or its next attempt finds it in the row),
--    or hands it on when it leaves the queue. (Ending it let a waiting Acquire of the same
--    lessor claim and trust a grant the server no longer had: issue 21.)
--  * A hand-off concurrent with this statement is never ended. It writes the lease row (the new
--    holder and token) and the queue row (granted_token) in one transaction. Committed before
--    this statement's snapshot: both are seen, and the grant is spared. Not committed by then:
--    the lease row's version in the snapshot has the releasing holder, never @holder (a release
--    does not hand a lease to its own holder's wait), so it does not match, and is neither
--    locked nor rechecked. A row that matches (a grant of @holder) and is updated meanwhile is
--    rechecked on its latest version (NOT EXISTS still reads the snapshot): a renewal keeps its
--    holder and token, a release or a hand-off of it ends it or gives it another holder, so no
--    recheck meets a grant handed to @holder.
--  * A queue row loses the grant it records only once its wait has taken the grant to claim it
--    or hand it on (both under the name's gate, which this cleanup's caller holds too), or to
--    SweepLeases once the row left the queue more than its grace ago (a minute at least): a
--    grant delivered by NOTIFY and not claimed yet is in @keep_tokens whatever became of its row.
--  * The caller runs it once the abandoned statement's backend has exited, so that statement
--    has committed or rolled back. Behind a pooler it may still run: the cleanup is then best
--    effort, and a late grant expires by its TTL.
UPDATE fencelock.leases AS l
SET expires_at = clock_timestamp()
WHERE l.name = ANY (sqlc.arg(names)::text[]) AND l.holder = sqlc.arg(holder)::text
  AND l.token <> ALL (sqlc.arg(keep_tokens)::bigint[]) AND l.expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM fencelock.lease_waiters AS w
                  WHERE w.name = l.name AND w.holder = l.holder AND w.granted_token = l.token);

-- name: LeaseGuard :one
-- Checks, inside the caller's transaction, that the grant (name, holder, token) is still
-- current and unexpired on the database clock, and holds the row FOR KEY SHARE until the
-- caller's transaction ends: a takeover locks the row FOR UPDATE (LeaseGrant sets the key
-- column), which conflicts, so it cannot commit before the caller does; the holder's own
-- renewals and release (non-key updates, FOR NO KEY UPDATE) do not conflict and go on.
SELECT l.expires_at
FROM fencelock.leases AS l
WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text AND l.token = sqlc.arg(token)::bigint
  AND l.expires_at > clock_timestamp()
FOR KEY SHARE;

-- name: LeaseFence :one
-- Checks the grant (name, holder, token) and advances the fence of @resource to its token, in
-- one statement inside the caller's transaction: the lease row must still have this holder and
-- token and be unexpired on the database clock, and is then held FOR KEY SHARE until the
-- caller's transaction ends (no takeover can commit before it, as for LeaseGuard; the holder's
-- renewals are not held up); the fence row is advanced to the token,
-- or left alone when a larger token has been seen, and stays locked until the transaction
-- ends. held = 0: the grant is gone (nothing was fenced); advanced = 0 with held = 1: stale.
-- Raises synchronous_commit from off to on for the caller's transaction, as FenceAdvance does.
-- The token is the lease row's, so it was issued; a high-water mark above every issued token
-- is replaced, as FenceAdvance does.
WITH cfg AS MATERIALIZED (
    SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) AS sync_commit
), held AS MATERIALIZED (
    SELECT l.token
    FROM fencelock.leases AS l, cfg
    WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text AND l.token = sqlc.arg(token)::bigint
      AND l.expires_at > clock_timestamp()
    FOR KEY SHARE OF l
), advanced AS (
    INSERT INTO fencelock.fences AS f (resource, token)
    SELECT sqlc.arg(resource)::text, held.token FROM held
    ON CONFLICT (resource) DO UPDATE SET token = excluded.token
    WHERE f.token <= excluded.token OR f.token > fencelock.issued_bound()
    RETURNING f.token
)
SELECT (SELECT count(*) FROM held)::bigint AS held, (SELECT count(*) FROM advanced)::bigint AS advanced;

-- name: LeaseSweep :one
-- Deletes expired lease rows among the next @page_size rows after @after in name order, in
-- one statement: a keyset page, so a whole sweep reads each row once and one statement holds
-- at most @page_size row locks for a few milliseconds. A row is deleted only when it expired
-- more than @grace_us microseconds ago on the database clock: renewals and GuardTx act only on
-- unexpired rows, so no grant can still be renewed or guarded through it (the grace covers a
-- database clock stepped back). Rows locked by anyone (a grant taking the name over, a
-- transaction-scoped holder) are skipped, never waited for, and rows granted since the
-- snapshot are re-checked under the row lock and kept. Tokens come from the sequence, not the
-- row, so a name granted again after its row was deleted still gets a larger token. A
-- semaphore's permit rows (permit_wait set) are kept: at most a limit of them per semaphore,
-- and a permit's slot is found free again only through its row (migration 00012's reclaim
-- never inserts a free slot for a row it cannot see, which could be one a grant is creating).
-- Returns the last name of the page ('' when the page was empty: the sweep is done) and the
-- count.
WITH page AS MATERIALIZED (
    SELECT cur.name FROM fencelock.leases AS cur
    WHERE cur.name > sqlc.arg(after)::text
    ORDER BY cur.name
    LIMIT sqlc.arg(page_size)::integer
), doomed AS (
    SELECT l.name FROM fencelock.leases AS l JOIN page ON l.name = page.name
    WHERE l.expires_at < clock_timestamp() - sqlc.arg(grace_us)::bigint::float8 * interval '1 microsecond'
      AND l.permit_wait IS NULL
    FOR UPDATE OF l SKIP LOCKED
), deleted AS (
    DELETE FROM fencelock.leases AS l USING doomed WHERE l.name = doomed.name
    RETURNING l.name
)
SELECT coalesce((SELECT max(page.name) FROM page), '')::text AS last,
       (SELECT count(*) FROM deleted)::bigint AS deleted;

-- name: TokenFlushesSweep :execrows
-- Deletes the rows of fencelock.token_flushes whose backend has exited. Harmless for a live
-- backend too: its next advisory token writes its row again.
DELETE FROM fencelock.token_flushes AS f
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity AS a WHERE a.pid = f.pid);
