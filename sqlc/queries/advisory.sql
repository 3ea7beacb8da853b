-- name: AdvisoryLock :one
-- Takes a session advisory lock, exclusive or @shared, in one statement: with @wait it waits
-- in the server's lock queue (FIFO among conflicting requests) until granted or cancelled,
-- else it only tries. The key is one bigint (@key, @pair false) or two integers (@k1, @k2,
-- @pair true): Postgres keeps the two forms in separate key spaces; CASE evaluates only the
-- branch it picks. A waiting lock function returns void, which casts to the empty text, not
-- NULL: a wait that returns is a grant, so granted is then true unless the session was
-- refused. It reports why it took nothing when the session cannot be trusted with a session
-- lock: the server is in recovery (a lock taken on a hot standby excludes no one on the
-- primary), or the backend pid differs from @startup_pid, the one the connection reported at
-- startup (a pooler sits between: the next statement may run in another session, and closing
-- the client connection would not end the server session that holds the lock); @startup_pid 0
-- skips that check, for a pooler declared to pin sessions (WithSessionPooler). Neither takes
-- the lock: the checks come before the lock in the CASE. It leaves application_name alone: the
-- watchdog's first probe of the lock labels it (AdvisorySessionLabel), so a lock held for less
-- than one watchdog interval pays no set_config and no ParameterStatus message (issue 31), and
-- the caller knows the application_name to put back from the server's reports (see
-- AdvisoryLockTryKey). With @tokens it draws a fencing
-- token from the lease sequence after the grant with fencelock.next_token(true), which writes
-- this backend's row of fencelock.token_flushes and raises synchronous_commit from off to on,
-- so the statement's commit flushes the WAL and the token is durable before the result
-- returns, even when it falls in a range WAL-logged by a transaction that rolled back (a bare
-- nextval writes no WAL there, and a commit that wrote no WAL flushes nothing). In a
-- transaction lock (AdvisoryLockTx) the token is durable once the caller's transaction commits.
SELECT g.granted::boolean AS granted,
       pg_is_in_recovery() AS in_recovery,
       pg_backend_pid() AS backend_pid,
       (CASE WHEN g.granted AND sqlc.arg(tokens)::boolean THEN
           fencelock.next_token(true)
        ELSE 0 END)::bigint AS token
FROM (SELECT CASE
          WHEN pg_is_in_recovery() OR (sqlc.arg(startup_pid)::integer <> 0 AND pg_backend_pid() <> sqlc.arg(startup_pid)::integer) THEN false
          WHEN sqlc.arg(wait)::boolean AND sqlc.arg(pair)::boolean AND sqlc.arg(shared)::boolean THEN pg_advisory_lock_shared(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)::text IS NOT NULL
          WHEN sqlc.arg(wait)::boolean AND sqlc.arg(pair)::boolean THEN pg_advisory_lock(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)::text IS NOT NULL
          WHEN sqlc.arg(wait)::boolean AND sqlc.arg(shared)::boolean THEN pg_advisory_lock_shared(sqlc.arg(key)::bigint)::text IS NOT NULL
          WHEN sqlc.arg(wait)::boolean THEN pg_advisory_lock(sqlc.arg(key)::bigint)::text IS NOT NULL
          WHEN sqlc.arg(pair)::boolean AND sqlc.arg(shared)::boolean THEN pg_try_advisory_lock_shared(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)
          WHEN sqlc.arg(pair)::boolean THEN pg_try_advisory_lock(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)
          WHEN sqlc.arg(shared)::boolean THEN pg_try_advisory_lock_shared(sqlc.arg(key)::bigint)
          ELSE pg_try_advisory_lock(sqlc.arg(key)::bigint)
      END AS granted) AS g;

-- name: AdvisoryUnlock :one
-- Releases one session advisory lock and, when the watchdog labelled it (@labelled), puts
-- @prev_application_name back, in one statement for every key form and mode (the CASE as in
-- AdvisoryLock). released is false when this session did not hold the lock: the caller must
-- then close the connection rather than pool it, since it cannot know what the session holds
-- (application_name is then left as it is). It takes a flag rather than always setting
-- application_name, although setting it to the value it has sends no ParameterStatus (the
-- server reports only a changed value): an unlabelled lock then leaves the session's
-- application_name untouched whatever the caller believes it to be, and pays no set_config,
-- as AdvisoryUnlockKeyBare does for an int64 key. The outer CASE releases first and sets
-- application_name only after a release (CASE evaluates in order; AND and OR need not).
SELECT (CASE
          WHEN NOT (CASE
                      WHEN sqlc.arg(pair)::boolean AND sqlc.arg(shared)::boolean THEN pg_advisory_unlock_shared(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)
                      WHEN sqlc.arg(pair)::boolean THEN pg_advisory_unlock(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)
                      WHEN sqlc.arg(shared)::boolean THEN pg_advisory_unlock_shared(sqlc.arg(key)::bigint)
                      ELSE pg_advisory_unlock(sqlc.arg(key)::bigint)
                    END) THEN false
          WHEN sqlc.arg(labelled)::boolean THEN set_config('application_name', sqlc.arg(prev_application_name)::text, false) IS NOT NULL
          ELSE true
        END)::boolean AS released;

-- name: AdvisoryLockTryKey :one
-- Takes an exclusive session lock on an int64 key (the form a name maps to) if it is free, with
-- pg_try_advisory_lock(bigint).
-- This statement and its three siblings, one per lock function, take the same lock as
-- AdvisoryLock (its checks, in the same order, the same token), in one expression of one
-- column, each with only the arguments it uses. A CASE that picks the lock function from
-- @wait, @pair and @shared takes nine arguments, and costs its statement more than the checks
-- and the lock themselves (issue 23: the pair at 1.49x the bare lock and unlock, 1.17x split).
-- The result is:
--   -2:   the session was refused, before it locked: the server is in recovery, or the backend
--         pid is not @startup_pid (a pooler between; see AdvisoryLock). The caller asks which
--         (AdvisorySessionState); this never happens on a healthy direct connection.
--   -1:   not granted (try only; a wait that returns is a grant).
--   0:    granted, without a token (@tokens false).
--   > 0:  granted, and the fencing token drawn after the grant by fencelock.next_token(true),
--         durable before the result returns (see AdvisoryLock).
-- It does not name the lock in application_name: a set_config here, and the ParameterStatus
-- message the server sends for it, cost the lock and unlock pair a quarter of its rate (0.75x
-- the raw pg_try_advisory_lock and pg_advisory_unlock; issue 31). The watchdog's first probe
-- labels a lock still held then (AdvisorySessionLabel); a shorter lock shows by key only in
-- fencelock.advisory_locks. The caller knows the application_name to put back after a label
-- from the server's ParameterStatus reports (application_name is a reported setting), so no
-- statement returns it. @startup_pid is never 0 here: a declared session pooler takes
-- AdvisoryLock, which returns the backend pid.
SELECT (CASE
          WHEN pg_is_in_recovery() OR pg_backend_pid() <> sqlc.arg(startup_pid)::integer THEN -2
          WHEN pg_try_advisory_lock(sqlc.arg(key)::bigint) THEN
              CASE WHEN sqlc.arg(tokens)::boolean THEN fencelock.next_token(true) ELSE 0 END
          ELSE -1
        END)::bigint AS grant_token;

-- name: AdvisoryLockTryKeyShared :one
-- AdvisoryLockTryKey for a shared lock (pg_try_advisory_lock_shared).
SELECT (CASE
          WHEN pg_is_in_recovery() OR pg_backend_pid() <> sqlc.arg(startup_pid)::integer THEN -2
          WHEN pg_try_advisory_lock_shared(sqlc.arg(key)::bigint) THEN
              CASE WHEN sqlc.arg(tokens)::boolean THEN fencelock.next_token(true) ELSE 0 END
          ELSE -1
        END)::bigint AS grant_token;

-- name: AdvisoryLockWaitKey :one
-- AdvisoryLockTryKey that waits (pg_advisory_lock(bigint)) in the server's lock queue until
-- granted or cancelled; it returns void, which casts to the empty text, not NULL, so a wait
-- that returns takes the grant's branch.
SELECT (CASE
          WHEN pg_is_in_recovery() OR pg_backend_pid() <> sqlc.arg(startup_pid)::integer THEN -2
          WHEN pg_advisory_lock(sqlc.arg(key)::bigint)::text IS NOT NULL THEN
              CASE WHEN sqlc.arg(tokens)::boolean THEN fencelock.next_token(true) ELSE 0 END
          ELSE -1
        END)::bigint AS grant_token;

-- name: AdvisoryLockWaitKeyShared :one
-- AdvisoryLockWaitKey for a shared lock (pg_advisory_lock_shared).
SELECT (CASE
          WHEN pg_is_in_recovery() OR pg_backend_pid() <> sqlc.arg(startup_pid)::integer THEN -2
          WHEN pg_advisory_lock_shared(sqlc.arg(key)::bigint)::text IS NOT NULL THEN
              CASE WHEN sqlc.arg(tokens)::boolean THEN fencelock.next_token(true) ELSE 0 END
          ELSE -1
        END)::bigint AS grant_token;

-- name: AdvisorySessionState :one
-- Why a session lock statement refused its session (a -2 from AdvisoryLockTryKey and its
-- kind): the server is in recovery, or the backend pid is not the one the connection reported
-- at startup. Read-only; it runs only after a refusal.
SELECT pg_is_in_recovery() AS in_recovery, pg_backend_pid() AS backend_pid;

-- name: AdvisoryUnlockKeyBare :one
-- Releases an exclusive session lock on an int64 key that the watchdog never labelled (held
-- for less than one watchdog interval, the usual case), with pg_advisory_unlock alone:
-- application_name was never changed, so there is nothing to put back. released is false when
-- this session did not hold the lock (the caller then closes the connection).
SELECT pg_advisory_unlock(sqlc.arg(key)::bigint) AS released;

-- name: AdvisoryUnlockKeySharedBare :one
-- AdvisoryUnlockKeyBare for a shared lock (pg_advisory_unlock_shared).
SELECT pg_advisory_unlock_shared(sqlc.arg(key)::bigint) AS released;

-- name: AdvisoryUnlockKey :one
-- Releases an exclusive session lock on an int64 key that the watchdog labelled
-- (AdvisorySessionLabel), and puts @prev_application_name back, as AdvisoryUnlock does with
-- @labelled, with only the arguments it uses. released is false when this session did not
-- hold the lock (application_name is then left as it is: the caller closes the connection).
SELECT (CASE WHEN pg_advisory_unlock(sqlc.arg(key)::bigint)
             THEN set_config('application_name', sqlc.arg(prev_application_name)::text, false) IS NOT NULL
             ELSE false END)::boolean AS released;

-- name: AdvisoryUnlockKeyShared :one
-- AdvisoryUnlockKey for a shared lock (pg_advisory_unlock_shared).
SELECT (CASE WHEN pg_advisory_unlock_shared(sqlc.arg(key)::bigint)
             THEN set_config('application_name', sqlc.arg(prev_application_name)::text, false) IS NOT NULL
             ELSE false END)::boolean AS released;

-- name: AdvisorySessionCheck :one
-- The watchdog's probe of a held lock's session: it fails when the session is gone (backend
-- terminated, server restarted, connection broken), and returns the backend pid, which must
-- still be the one that took the lock. A live session keeps its session locks: only the
-- session itself can release them, and the lock's connection is used by nothing else. Every
-- probe but a lock's first (AdvisorySessionLabel) is this one.
SELECT pg_backend_pid() AS backend_pid;

-- name: AdvisorySessionLabel :one
-- The watchdog's first probe of a held lock: AdvisorySessionCheck, which also names the lock
-- in application_name (@label, "fencelock <name>" or "fencelock key <key>"), so that
-- pg_stat_activity joined with pg_locks (fencelock.advisory_locks, fencelock locks) shows who
-- holds what. Labelling here rather than in the lock statement keeps the set_config and its
-- ParameterStatus message off the lock and unlock pair (issue 31): a lock is labelled within
-- one watchdog interval of its grant, and one released sooner never is. It labels only the
-- backend that took the lock (@pid): when the connection now reaches another (a pooler
-- between), the lock is lost and that backend, which is not the lock's, keeps its name. The
-- unlock then puts back the application_name the session had (AdvisoryUnlockKey,
-- AdvisoryUnlock with @labelled). The CASE tests the pid before it sets.
SELECT (CASE
          WHEN pg_backend_pid() <> sqlc.arg(pid)::integer THEN pg_backend_pid()
          WHEN set_config('application_name', sqlc.arg(label)::text, false) IS NOT NULL THEN pg_backend_pid()
        END)::integer AS backend_pid;

-- name: AdvisoryLockTx :one
-- Takes a transaction advisory lock inside the caller's transaction, released at its end:
-- with @wait it waits in the server's lock queue until granted or cancelled, else it only
-- tries. Key, @shared, @wait and CASE as in AdvisoryLock. Reports recovery as AdvisoryLock
-- does, before it locks. With @tokens, as AdvisoryLock.
SELECT g.granted::boolean AS granted,
       pg_is_in_recovery() AS in_recovery,
       (CASE WHEN g.granted AND sqlc.arg(tokens)::boolean THEN
           fencelock.next_token(true)
        ELSE 0 END)::bigint AS token
FROM (SELECT CASE
          WHEN pg_is_in_recovery() THEN false
          WHEN sqlc.arg(wait)::boolean AND sqlc.arg(pair)::boolean AND sqlc.arg(shared)::boolean THEN pg_advisory_xact_lock_shared(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)::text IS NOT NULL
          WHEN sqlc.arg(wait)::boolean AND sqlc.arg(pair)::boolean THEN pg_advisory_xact_lock(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)::text IS NOT NULL
          WHEN sqlc.arg(wait)::boolean AND sqlc.arg(shared)::boolean THEN pg_advisory_xact_lock_shared(sqlc.arg(key)::bigint)::text IS NOT NULL
          WHEN sqlc.arg(wait)::boolean THEN pg_advisory_xact_lock(sqlc.arg(key)::bigint)::text IS NOT NULL
          WHEN sqlc.arg(pair)::boolean AND sqlc.arg(shared)::boolean THEN pg_try_advisory_xact_lock_shared(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)
          WHEN sqlc.arg(pair)::boolean THEN pg_try_advisory_xact_lock(sqlc.arg(k1)::integer, sqlc.arg(k2)::integer)
          WHEN sqlc.arg(shared)::boolean THEN pg_try_advisory_xact_lock_shared(sqlc.arg(key)::bigint)
          ELSE pg_try_advisory_xact_lock(sqlc.arg(key)::bigint)
      END AS granted) AS g;
