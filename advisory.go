package fencelock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/advisory"
	"github.com/fencelock/fencelock/internal/timing"
)

// AdvisoryLocker takes Postgres advisory locks: session locks ([AdvisoryLocker.TryLock],
// [AdvisoryLocker.Lock]), each held by a session of its own on a connection taken from the
// pool, and transaction locks ([AdvisoryLocker.TryLockTx], [AdvisoryLocker.LockTx]) held by the
// caller's transaction. Each call takes [LockOption]s: [Shared] for a shared lock (default
// [Exclusive]), [AtKey] for a key given as it is.
//
// Advisory locks are the cheapest locks Postgres has (no table, released by the server when
// the session or transaction ends), good for efficiency: a job that runs once. A paused
// holder still wakes up believing it holds one, so guard writes with fencing tokens
// ([WithFencingTokens], [FenceTx]) where correctness depends on the lock.
//
// What it gets right:
//   - a lock's connection never returns to the pool while it may still hold a lock: when the
//     unlock cannot be confirmed, or an acquire fails in a way that leaves the grant in doubt
//     (ctx ended mid-wait), the connection is closed instead (after a cancel request, so a
//     grant racing the cancel is undone by the session's end);
//   - a watchdog notices a lost session (backend terminated, server restart, broken
//     connection) within twice [WithWatchdogInterval], and closes the lock's Done;
//   - a hot standby is refused ([ErrReadOnly]): its locks exclude no one on the primary;
//   - a connection pooler is detected and session locks refused ([ErrConnectionPooler]),
//     unless declared a session pooler ([WithSessionPooler]); transaction locks work behind
//     PgBouncer's transaction pooling;
//   - taking a lock the locker already holds is an error ([ErrAlreadyHeld]), never a silent
//     second level; so is a name whose key collides with a held one ([*KeyCollisionError]);
//   - a cap on held session locks ([WithMaxSessionLocks], [ErrTooManyLocks]).
//
// Names map to int64 keys by [SHA256KeyHash] in the locker's namespace; the int64 and int32
// pair forms are taken as they are with [AtKey]. A session holding a lock is labelled: the
// watchdog's first probe of the lock sets its application_name to "fencelock <name>" (or
// "fencelock key <key>"), so the view fencelock.advisory_locks (pg_locks joined with
// pg_stat_activity) shows who holds what, and Unlock puts the previous application_name back.
// The label comes within one [WithWatchdogInterval] of the grant (a watchdog round's length
// more at worst), not with it: a lock released sooner is never labelled, and the view shows
// it by key, with a NULL name. (Labelling in the lock statement cost the lock and unlock pair
// a quarter of its rate.)
//
// An AdvisoryLocker is safe for concurrent use. It needs no Close: it runs no goroutine of its
// own but a watchdog round, every [WithWatchdogInterval] while it holds session locks.
type AdvisoryLocker struct {
	pool     *pgxpool.Pool
	cfg      advisoryConfig
	watchdog *timing.Loop // rounds of watchdogRound (probes: advisory_watchdog.go); armed while a session lock is held

	mu   sync.Mutex
	held *advisory.Held[*AdvisoryLock] // held and being acquired session locks; guarded by mu
}

// NewAdvisoryLocker returns a locker on pool, which must reach a primary directly (not through
// a pooler, for session locks). Errors: an [*ArgumentError] for a nil pool or a bad option
// (a nil one included). No SQL runs. (A [LessorOption] does not compile here.)
//
// Defaults:
//   - namespace: [DefaultNamespace] ([WithNamespace])
//   - key hash: [SHA256KeyHash] ([WithKeyHash])
//   - watchdog interval: [DefaultWatchdogInterval] ([WithWatchdogInterval])
//   - cap on held session locks: [DefaultMaxSessionLocks], or the pool's MaxConns - 1 if that
//     is smaller (at least 1) ([WithMaxSessionLocks])
//   - fencing tokens: off ([WithFencingTokens])
//   - logger: discards ([WithLogger])
func NewAdvisoryLocker(pool *pgxpool.Pool, opts ...AdvisoryOption) (*AdvisoryLocker, error) {
	if pool == nil {
		return nil, argError("pool", "must not be nil")
	}
	cfg, err := newAdvisoryConfig(pool, opts)
	if err != nil {
		return nil, err
	}
	a := &AdvisoryLocker{pool: pool, cfg: cfg, held: advisory.NewHeld[*AdvisoryLock](cfg.maxLocks)}
	a.watchdog = timing.NewLoop(cfg.clock, a.watchdogRound)
	return a, nil
}

// Key returns the advisory key that name maps to in this locker's namespace. Errors: an
// [*ArgumentError] for a name that is empty, longer than [MaxNameLength] bytes, not UTF-8, or
// contains NUL.
func (a *AdvisoryLocker) Key(name string) (AdvisoryKey, error) {
	if err := validateName("name", name); err != nil {
		return AdvisoryKey{}, err
	}
	return Int64Key(a.cfg.hash(a.cfg.namespace, name)), nil
}

// target resolves a lock call's name and options into the key to lock and its mode. Errors:
// an [*ArgumentError] for a bad option or name (a name may be "" only with AtKey).
func (a *AdvisoryLocker) target(name string, opts []LockOption) (AdvisoryKey, LockMode, error) {
	if len(opts) == 0 { // the usual call: no options to apply (applyAll's closure would move c to the heap)
		key, err := a.Key(name)
		return key, Exclusive, err
	}
	var c lockConfig
	if err := applyAll(opts, func(o LockOption) error { return o.applyLock(&c) }); err != nil {
		return AdvisoryKey{}, 0, err
	}
	if !c.keySet {
		key, err := a.Key(name)
		return key, c.mode, err
	}
	if name != "" {
		if err := validateName("name", name); err != nil {
			return AdvisoryKey{}, 0, err
		}
	}
	return c.key, c.mode, nil
}

// TryLock takes the session lock of name if it is free, in one statement, on a connection of
// its own: exclusive, or shared with [Shared] (it then coexists with other shared holders and
// excludes exclusive ones); of the key name maps to ([AdvisoryLocker.Key]), or of the key
// given by [AtKey] (name then only labels the lock, and may be ""). Errors: [ErrNotAcquired]
// if it is held; an [*ArgumentError] for a bad name or option (no SQL runs); [ErrAlreadyHeld]
// or a [*KeyCollisionError] if this locker holds the key; [ErrTooManyLocks]; an error
// wrapping [ErrReadOnly] on a hot standby; a [*PoolerError] behind a pooler; otherwise pgx's
// error, wrapped. Safe for concurrent use.
func (a *AdvisoryLocker) TryLock(ctx context.Context, name string, opts ...LockOption) (*AdvisoryLock, error) {
	return a.lock(ctx, name, opts, false)
}

// Lock takes the session lock of name, as [AdvisoryLocker.TryLock] does (same options), but
// waits on the server, in its queue (first come, first served among conflicting requests),
// until granted or ctx ends. If ctx ends first it returns ctx's error (wrapped) and holds
// nothing: the connection is closed after a cancel request, so a grant that raced the
// cancellation ends with the session. Other errors as for [AdvisoryLocker.TryLock], never
// [ErrNotAcquired].
func (a *AdvisoryLocker) Lock(ctx context.Context, name string, opts ...LockOption) (*AdvisoryLock, error) {
	return a.lock(ctx, name, opts, true)
}

func (a *AdvisoryLocker) lock(ctx context.Context, name string, opts []LockOption, wait bool) (*AdvisoryLock, error) {
	key, mode, err := a.target(name, opts)
	if err != nil {
		return nil, err
	}
	if err := a.reserve(name, key); err != nil {
		return nil, err
	}
	start, mt := time.Now(), mTryLock
	if wait {
		mt = mLock
	}
	lk, err := a.acquire(ctx, name, key, mode, wait)
	a.cfg.common.metrics.acquired(ctx, mt, start, err)
	if err != nil {
		a.mu.Lock()
		a.held.Cancel(key.k)
		a.mu.Unlock()
		return nil, err
	}
	a.register(lk)
	return lk, nil
}

// reserve claims key for an acquire by this locker, or says why it cannot.
func (a *AdvisoryLocker) reserve(name string, key AdvisoryKey) error {
	a.mu.Lock()
	r, heldName := a.held.Reserve(name, key.k)
	a.mu.Unlock()
	switch r {
	case advisory.Collision:
		return &KeyCollisionError{Key: key, Name: name, Held: heldName}
	case advisory.AlreadyHeld:
		return fmt.Errorf("lock %s: %w", describeLock(name, key), ErrAlreadyHeld)
	case advisory.Full:
		return fmt.Errorf("lock %s: %w (cap %d, see WithMaxSessionLocks)", describeLock(name, key), ErrTooManyLocks, a.cfg.maxLocks)
	}
	return nil
}

// register records a granted lock and, if the watchdog was stopped, arms its first round one
// interval from now.
func (a *AdvisoryLocker) register(lk *AdvisoryLock) {
	a.mu.Lock()
	a.held.Grant(lk.key.k, lk.name, lk)
	start := a.watchdog.StartLocked()
	a.mu.Unlock()
	if start {
		a.watchdog.WakeAt(a.cfg.clock.Now().Add(a.cfg.watchdog))
	}
}

// unregister forgets a lock that ended. It leaves the watchdog as it is, even with the last
// lock: the armed round finds nothing held and stops the loop (watchdogRound). Stopping the
// timer here, and arming it again with the next lock, cost every lock taken and released
// back to back (the usual way) two timer changes, for a round that runs at most once an
// interval when nothing is held (issue 23).
func (a *AdvisoryLocker) unregister(lk *AdvisoryLock) {
	a.mu.Lock()
	a.held.Forget(lk.key.k, lk)
	a.mu.Unlock()
}

// watchdogRound is the watchdog loop's step: it probes every held lock, all at once, each for
// at most one interval, and asks for the next round an interval after this one ended. The
// first round runs one interval after the loop was armed (register).
func (a *AdvisoryLocker) watchdogRound(now time.Time) (next time.Time, ok bool) {
	a.mu.Lock()
	locks := a.held.Granted()
	if len(locks) == 0 {
		a.watchdog.StopLocked()
		a.mu.Unlock()
		return now, false
	}
	a.mu.Unlock()
	advisory.ProbeAll(locks, func(lk *AdvisoryLock) { lk.probe(a.cfg.watchdog) })
	return a.cfg.clock.Now().Add(a.cfg.watchdog), true
}

// acquire takes the lock on a connection of its own and checks the session is one a session
// lock can be trusted on.
func (a *AdvisoryLocker) acquire(ctx context.Context, name string, key AdvisoryKey, mode LockMode, wait bool) (*AdvisoryLock, error) {
	what := func() string { return "lock " + describeLock(name, key) } // for errors only
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return nil, wrapPg(what(), err)
	}
	pgConn := conn.Conn().PgConn()
	startupPID := pgConn.PID()
	checkPID := int32(startupPID)
	if a.cfg.sessionPooler {
		checkPID = 0 // a declared session pooler: the pids differ, and that is safe
	}
	// The application_name to put back on unlock, once the watchdog has labelled the session,
	// is the one the server last reported (it reports every change of it), so the lock
	// statement need not read it.
	row, err := advisory.LockSession(ctx, conn, advisory.Request{
		Name: name, Key: key.k, Shared: mode == Shared, Wait: wait, Tokens: a.cfg.tokens,
	}, checkPID, pgConn.ParameterStatus("application_name"))
	if err != nil {
		// A failed wait may have been granted as ctx ended, with the grant's reply still on
		// its way (pgx then reports a timeout, not a server error); a statement that failed
		// after its grant (fencelock.next_token refused the token: ErrTokenBudget,
		// ErrTokenEpochBehind, ...) took the lock, which a session keeps through the
		// statement's rollback. Closing the session ends it once the backend exits, which can
		// be a one-way latency later: wait for that, whatever the error, so that nothing is
		// held when the call returns (issue 30).
		destroySession(ctx, conn, wait)
		cctx, stop := detached(ctx, closeTimeout)
		if werr := awaitBackendExit(cctx, a.pool, startupPID); werr != nil {
			err = fmt.Errorf("%w (and its session, which may hold the lock, did not end: %w)", err, werr)
		}
		stop()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", what(), context.Cause(ctx))
		}
		return nil, wrapPg(what(), err)
	}
	// A refused session took nothing (the statement checks before it locks), so its
	// connection goes back to the pool as it came.
	switch {
	case row.Refused && row.InRecovery:
		conn.Release()
		return nil, fmt.Errorf("%s: %w", what(), ErrReadOnly)
	case row.Refused:
		conn.Release()
		return nil, fmt.Errorf("%s: %w", what(), &PoolerError{StartupPID: startupPID, BackendPID: uint32(row.BackendPid)})
	case !row.Granted:
		conn.Release()
		return nil, ErrNotAcquired
	}
	return &AdvisoryLock{
		locker:  a,
		common:  &a.cfg.common,
		name:    name,
		key:     key,
		mode:    mode,
		token:   Token(row.Token),
		conn:    conn,
		pid:     uint32(row.BackendPid),
		prevApp: row.PrevApp,
		ending:  newGrantEnd(),
	}, nil
}
