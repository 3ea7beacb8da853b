package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/timing"
)

// LockMode is the mode of an advisory lock.
type LockMode int

const (
	// Exclusive conflicts with every other holder of the key.
	Exclusive LockMode = iota
	// Shared conflicts only with Exclusive holders of the key.
	Shared
)

// String returns "exclusive" or "shared".
func (m LockMode) String() string {
	if m == Shared {
		return "shared"
	}
	return "exclusive"
}

// AdvisoryLocker takes Postgres advisory locks: session locks ([AdvisoryLocker.TryLock],
// [AdvisoryLocker.Lock] and their shared and by-key variants), each held by a session of its
// own on a connection taken from the pool, and transaction locks
// ([AdvisoryLocker.TryLockTx], [AdvisoryLocker.LockTx]) held by the caller's transaction.
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
//   - a cap on held session locks ([WithMaxHeld], [ErrTooManyLocks]).
//
// Names map to int64 keys by [SHA256KeyHash] in the locker's namespace; the int64 and int32
// pair forms are taken as they are with the *Key methods. A session holding a lock sets its
// application_name to "fencelock <name>", so the view fencelock.advisory_locks (pg_locks joined
// with pg_stat_activity) shows who holds what.
//
// An AdvisoryLocker is safe for concurrent use. It needs no Close: it runs no goroutine of its
// own but a watchdog round, every [WithWatchdogInterval] while it holds session locks.
type AdvisoryLocker struct {
	pool     *pgxpool.Pool
	q        *db.Queries
	cfg      advisoryConfig
	watchdog *timing.Loop // advisory_watchdog.go; armed while a session lock is held

	mu   sync.Mutex
	held map[AdvisoryKey]*heldEntry // held and being acquired session locks
}

type heldEntry struct {
	name string
	lock *AdvisoryLock // nil while being acquired
}

// NewAdvisoryLocker returns a locker on pool, which must reach a primary directly (not through
// a pooler, for session locks). Errors: an [*ArgumentError] for a nil pool or a bad option
// (a nil one included). No SQL runs. (A [LessorOption] does not compile here.)
//
// Defaults:
//   - namespace: [DefaultNamespace] ([WithNamespace])
//   - key hash: [SHA256KeyHash] ([WithKeyHash])
//   - watchdog interval: [DefaultWatchdogInterval] ([WithWatchdogInterval])
//   - cap on held session locks: [DefaultMaxHeld], or the pool's MaxConns - 1 if that is
//     smaller (at least 1) ([WithMaxHeld])
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
	a := &AdvisoryLocker{pool: pool, q: db.New(), cfg: cfg, held: make(map[AdvisoryKey]*heldEntry)}
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

// TryLock takes the exclusive session lock of name if it is free, in one statement, on a
// connection of its own. Errors: [ErrNotAcquired] if it is held; an [*ArgumentError] (no SQL
// runs); [ErrAlreadyHeld] or a [*KeyCollisionError] if this locker holds the key;
// [ErrTooManyLocks]; an error wrapping [ErrReadOnly] on a hot standby; a [*PoolerError]
// behind a pooler; otherwise pgx's error, wrapped.
func (a *AdvisoryLocker) TryLock(ctx context.Context, name string) (*AdvisoryLock, error) {
	return a.lockName(ctx, name, Exclusive, false)
}

// Lock takes the exclusive session lock of name, waiting on the server, in its queue (first
// come, first served among conflicting requests), until granted or ctx ends. If ctx ends
// first it returns ctx's error (wrapped) and holds nothing: the connection is closed after a
// cancel request, so a grant that raced the cancellation ends with the session. Other errors
// as for [AdvisoryLocker.TryLock], never [ErrNotAcquired].
func (a *AdvisoryLocker) Lock(ctx context.Context, name string) (*AdvisoryLock, error) {
	return a.lockName(ctx, name, Exclusive, true)
}

// TryLockShared is [AdvisoryLocker.TryLock] in [Shared] mode: it coexists with other shared
// holders and excludes exclusive ones.
func (a *AdvisoryLocker) TryLockShared(ctx context.Context, name string) (*AdvisoryLock, error) {
	return a.lockName(ctx, name, Shared, false)
}

// LockShared is [AdvisoryLocker.Lock] in [Shared] mode.
func (a *AdvisoryLocker) LockShared(ctx context.Context, name string) (*AdvisoryLock, error) {
	return a.lockName(ctx, name, Shared, true)
}

// TryLockKey is [AdvisoryLocker.TryLock] for an explicit key (which no name maps from here),
// in mode.
func (a *AdvisoryLocker) TryLockKey(ctx context.Context, key AdvisoryKey, mode LockMode) (*AdvisoryLock, error) {
	return a.lock(ctx, "", key, mode, false)
}

// LockKey is [AdvisoryLocker.Lock] for an explicit key, in mode.
func (a *AdvisoryLocker) LockKey(ctx context.Context, key AdvisoryKey, mode LockMode) (*AdvisoryLock, error) {
	return a.lock(ctx, "", key, mode, true)
}

func (a *AdvisoryLocker) lockName(ctx context.Context, name string, mode LockMode, wait bool) (*AdvisoryLock, error) {
	key, err := a.Key(name)
	if err != nil {
		return nil, err
	}
	return a.lock(ctx, name, key, mode, wait)
}

func (a *AdvisoryLocker) lock(ctx context.Context, name string, key AdvisoryKey, mode LockMode, wait bool) (*AdvisoryLock, error) {
	if mode != Exclusive && mode != Shared {
		return nil, argError("mode", "is %d; want Exclusive or Shared", int(mode))
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
		delete(a.held, key)
		a.mu.Unlock()
		return nil, err
	}
	a.register(lk)
	return lk, nil
}

// reserve claims key for an acquire by this locker, or says why it cannot.
func (a *AdvisoryLocker) reserve(name string, key AdvisoryKey) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.held[key]; ok {
		if e.name != name {
			return &KeyCollisionError{Key: key, Name: name, Held: e.name}
		}
		return fmt.Errorf("lock %s: %w", describeLock(name, key), ErrAlreadyHeld)
	}
	if len(a.held) >= a.cfg.maxHeld {
		return fmt.Errorf("lock %s: %w (cap %d, see WithMaxHeld)", describeLock(name, key), ErrTooManyLocks, a.cfg.maxHeld)
	}
	a.held[key] = &heldEntry{name: name}
	return nil
}

// register records a granted lock and, if the watchdog was stopped, arms its first round one
// interval from now.
func (a *AdvisoryLocker) register(lk *AdvisoryLock) {
	a.mu.Lock()
	a.held[lk.key] = &heldEntry{name: lk.name, lock: lk}
	start := a.watchdog.StartLocked()
	a.mu.Unlock()
	if start {
		a.watchdog.WakeAt(a.cfg.clock.Now().Add(a.cfg.watchdog))
	}
}

// unregister forgets a lock that ended; with the last one it stops the watchdog.
func (a *AdvisoryLocker) unregister(lk *AdvisoryLock) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.held[lk.key]; ok && e.lock == lk {
		delete(a.held, lk.key)
	}
	if len(a.grantedLocked()) == 0 {
		a.watchdog.StopLocked()
	}
}

// grantedLocked returns the granted locks (not reservations being acquired). a.mu is held.
func (a *AdvisoryLocker) grantedLocked() []*AdvisoryLock {
	var locks []*AdvisoryLock
	for _, e := range a.held {
		if e.lock != nil {
			locks = append(locks, e.lock)
		}
	}
	return locks
}

// acquire takes the lock on a connection of its own and checks the session is one a session
// lock can be trusted on.
func (a *AdvisoryLocker) acquire(ctx context.Context, name string, key AdvisoryKey, mode LockMode, wait bool) (*AdvisoryLock, error) {
	what := func() string { return "lock " + describeLock(name, key) } // for errors only
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return nil, wrapPg(what(), err)
	}
	startupPID := conn.Conn().PgConn().PID()
	checkPID := int32(startupPID)
	if a.cfg.sessionPooler {
		checkPID = 0 // a declared session pooler: the pids differ, and that is safe
	}
	row, err := a.q.AdvisoryLock(ctx, conn, db.AdvisoryLockParams{
		StartupPid: checkPID,
		AppName:    applicationName(name, key),
		Tokens:     a.cfg.tokens,
		Wait:       wait,
		Pair:       key.pair, K1: key.k1, K2: key.k2, Key: key.key,
		Shared: mode == Shared,
	})
	if err != nil {
		// A failed wait may have been granted as ctx ended; a statement that failed after its
		// grant (fencelock.next_token refused the token: ErrTokenBudget, ErrTokenEpochBehind,
		// ...) took the lock, which a session keeps through the statement's rollback. Closing
		// the session ends it once the backend exits: wait for that, so that nothing is held
		// when the error returns.
		destroySession(ctx, conn, wait)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			cctx, stop := detached(ctx, closeTimeout)
			if werr := awaitBackendExit(cctx, a.pool, startupPID); werr != nil {
				err = fmt.Errorf("%w (and its session, which may hold the lock, did not end: %w)", err, werr)
			}
			stop()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", what(), context.Cause(ctx))
		}
		return nil, wrapPg(what(), err)
	}
	// A refused session took nothing (the statement checks before it locks), so its
	// connection goes back to the pool as it came.
	switch {
	case row.InRecovery:
		conn.Release()
		return nil, fmt.Errorf("%s: %w", what(), ErrReadOnly)
	case uint32(row.BackendPid) != startupPID && !a.cfg.sessionPooler:
		conn.Release()
		return nil, fmt.Errorf("%s: %w", what(), &PoolerError{StartupPID: startupPID, BackendPID: uint32(row.BackendPid)})
	case !row.Granted:
		conn.Release()
		return nil, ErrNotAcquired
	}
	return &AdvisoryLock{
		locker:  a,
		name:    name,
		key:     key,
		mode:    mode,
		token:   Token(row.Token),
		conn:    conn,
		pid:     uint32(row.BackendPid),
		prevApp: row.PrevApplicationName,
		ending:  newGrantEnd(),
	}, nil
}

var errPIDChanged = errors.New("the connection now reaches another backend")
