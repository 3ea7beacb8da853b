// Package advisory is the machinery of fencelock's advisory locks that has no public face: how
// a key is derived, described and shown to operators, the statements that take, release and
// probe a lock, the set of session locks a locker holds, and the watchdog's rounds. The root
// package's AdvisoryLocker, AdvisoryLock and AdvisoryKey are its only users; they turn what it
// reports into fencelock's typed errors.
//
// # Keys
//
// A [Key] is one int64 key or a pair of int32 keys, the two key spaces of Postgres's advisory
// lock functions (pg_locks.objsubid 1 and 2). Names map to int64 keys by [SHA256] in a
// namespace; [Describe] names a lock in messages.
//
// # Labels
//
// A session holding a lock is labelled: its application_name becomes "fencelock <name>" (or
// "fencelock key <key>"), which the view fencelock.advisory_locks (migration 00005) shows
// beside pg_locks. It is labelled lazily, by the watchdog's first probe of the lock
// ([LabelSession]), not by the lock statement: a set_config there, and the ParameterStatus
// message the server sends for it, cost the lock and unlock pair a quarter of its rate
// (issue 31). So a lock is labelled within one watchdog interval of its grant (a round's
// length more when the grant falls during a round), and a lock released sooner never is: the
// view shows it by key, with a NULL name. [UnlockSession] puts the previous application_name
// back only for a lock that was labelled.
//
// # SQL it owns
//
// The queries of sqlc/queries/advisory.sql, generated into internal/db, each run by one
// function here:
//   - AdvisoryLockTryKey, AdvisoryLockTryKeyShared, AdvisoryLockWaitKey and
//     AdvisoryLockWaitKeyShared ([LockSession], a session lock on an int64 key, the form names
//     map to): one statement per lock function (pg_try_advisory_lock, pg_advisory_lock and their
//     _shared forms), one column, with fencelock.next_token(true) after the grant, and
//     pg_is_in_recovery and pg_backend_pid checked before it; AdvisorySessionState says why a
//     session was refused;
//   - AdvisoryLock ([LockSession], a pair key, or behind a declared session pooler): the same,
//     every key form and mode in one statement, the lock function chosen by its CASE;
//     migrations 00002, 00003 and 00011 for next_token;
//   - AdvisoryUnlockKeyBare, AdvisoryUnlockKeySharedBare ([UnlockSession], an unlabelled lock on
//     an int64 key): pg_advisory_unlock and its shared form alone;
//   - AdvisoryUnlockKey, AdvisoryUnlockKeyShared, AdvisoryUnlock ([UnlockSession], a labelled
//     lock, and a pair key either way): pg_advisory_unlock and its forms, and the previous
//     application_name put back (for a pair key, only when labelled);
//   - AdvisorySessionLabel ([LabelSession]): pg_backend_pid and set_config('application_name'),
//     the watchdog's first probe of a lock, which labels it;
//   - AdvisorySessionCheck ([CheckSession]): pg_backend_pid, the watchdog's later probes;
//   - AdvisoryLockTx ([LockTx]): pg_try_advisory_xact_lock, pg_advisory_xact_lock and their
//     forms, and fencelock.next_token(true).
//
// (Migrate's own transaction lock, pg_advisory_xact_lock on a database/sql connection, is the
// root package's migrate_lock.go: it serves goose, not a locker.)
//
// # Held set
//
// A locker is not re-entrant and caps its session locks: [Held] records the keys it holds or
// is acquiring, with their names, and refuses a key held under the same name, a key held under
// another name (a collision of the hash), and a lock past the cap, before any SQL runs. It is
// guarded by its owner's mutex, the one that also guards the watchdog loop's running flag.
//
// # Watchdog
//
//	round (every interval while a session lock is held)
//	  ├── LabelSession(lock 1) ─┐   a lock's first probe: checks and labels it
//	  ├── CheckSession(lock 2) ─┼── all at once, each bounded by the interval
//	  └── CheckSession(lock n) ─┘
//	next round: one interval after this one ended
//
// [ProbeAll] runs one round's probes; a probe that fails, or finds another backend behind the
// connection ([*PIDChangedError]), ends its lock in the root package. So a lost session is
// noticed within twice the interval. The root package remembers which locks are labelled.
package advisory
